"""A seeded stream of sample order events (~230 bytes of JSON each) for the demo, tests and benchmarks.

Matches `examples/orders.yaml`; `avro_order_values` gives the same events as Confluent-framed Avro
(`examples/avro-orders.yaml`), registered by confluent-kafka's serializer, and moves to a second schema
with one more field (`coupon`) after a number of records: a producer that evolves its schema.
`malformed_every=N` makes every N-th record bad in a rotating way (broken JSON, a missing required field, a
wrong type, a value too large for its decimal), so the dead-letter path is exercised with realistic
variety.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime

CITIES = ["Oslo", "Bergen", "Lisbon", "Porto", "Lyon", "Turin", "Ghent", "Graz"]
TAGS = ["gift", "express", "fragile", "bulk", "promo", "repeat"]
CHANNELS = ["web", "mobile-app", "store", "phone", "partner-api", "marketplace"]
_BAD_KINDS = ("broken-json", "missing-id", "wrong-type", "decimal-overflow")


def order_event(i: int, rng: random.Random, now_ms: int) -> dict[str, object]:
    return {
        "id": i,
        "customer": f"customer-{rng.randrange(10_000):05d}",
        "amount": round(rng.uniform(1, 5_000), 2),
        "ts": datetime.fromtimestamp(now_ms / 1000, UTC).isoformat(timespec="milliseconds"),
        "shipping": {
            "street": f"{rng.randrange(1, 300)} {rng.choice(['Main', 'Harbour', 'Mill', 'Station'])} St",
            "city": rng.choice(CITIES),
            "country": rng.choice(["NO", "PT", "FR", "IT", "BE", "AT"]),
        },
        "tags": rng.sample(TAGS, rng.randrange(0, 3)),
        "channel": rng.choice(CHANNELS),
        "items": rng.randrange(1, 13),
    }


def order_values(seed: int = 7, start: int = 0, malformed_every: int = 0) -> Iterator[bytes]:
    rng = random.Random(seed)
    i = start
    while True:
        event = order_event(i, rng, int(time.time() * 1000))
        if malformed_every and i % malformed_every == malformed_every - 1:
            kind = _BAD_KINDS[(i // malformed_every) % len(_BAD_KINDS)]
            if kind == "broken-json":
                yield json.dumps(event).encode()[:-7]
            else:
                if kind == "missing-id":
                    del event["id"]
                elif kind == "wrong-type":
                    event["id"] = f"order-{i}"
                else:
                    event["amount"] = 1e12
                yield json.dumps(event).encode()
        else:
            yield json.dumps(event).encode()
        i += 1


_SHIPPING = {
    "type": "record",
    "name": "Shipping",
    "fields": [
        {"name": n, "type": ["null", "string"], "default": None} for n in ("street", "city", "country")
    ],
}
ORDER_AVRO: dict[str, object] = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long", "doc": "Order id, unique per order."},
        {"name": "customer", "type": ["null", "string"], "default": None},
        {
            "name": "amount",
            "type": ["null", {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}],
            "default": None,
        },
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "shipping", "type": ["null", _SHIPPING], "default": None},
        {"name": "tags", "type": ["null", {"type": "array", "items": "string"}], "default": None},
        {"name": "channel", "type": ["null", "string"], "default": None},
        {"name": "items", "type": ["null", "int"], "default": None},
    ],
}
#: ORDER_AVRO with one more optional field: the producer's next version.
ORDER_AVRO_V2: dict[str, object] = {
    **ORDER_AVRO,
    "fields": [*ORDER_AVRO["fields"], {"name": "coupon", "type": ["null", "string"], "default": None}],  # type: ignore[misc]
}


def avro_order_values(
    registry_url: str, topic: str, *, seed: int = 7, malformed_every: int = 0, evolve_after: int | None = None
) -> Iterator[bytes]:
    """The order events as Confluent-framed Avro: ORDER_AVRO, then ORDER_AVRO_V2 (with a `coupon`) from
    record `evolve_after` on; every `malformed_every`-th record's framing is broken (a wrong magic byte)."""
    from decimal import Decimal

    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": registry_url})
    context = SerializationContext(topic, MessageField.VALUE)
    v1 = AvroSerializer(client, json.dumps(ORDER_AVRO))
    v2 = AvroSerializer(client, json.dumps(ORDER_AVRO_V2))
    rng = random.Random(seed)
    i = 0
    while True:
        event = order_event(i, rng, int(time.time() * 1000))
        event["ts"] = datetime.fromisoformat(str(event["ts"]))
        event["amount"] = Decimal(str(event["amount"])).quantize(Decimal("0.01"))
        evolved = evolve_after is not None and i >= evolve_after
        if evolved:
            event["coupon"] = rng.choice([None, "WINTER10", "FREESHIP"])
        value = (v2 if evolved else v1)(event, context)
        assert value is not None
        if malformed_every and i % malformed_every == malformed_every - 1:
            value = b"\x07" + value[1:]
        yield value
        i += 1


class EventProducer(threading.Thread):
    """Produces order events to `topic` at about `rate` records/s until `stop()`; counts what was acked.
    `values`: other record values than the JSON events (e.g. `avro_order_values`)."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        rate: float,
        *,
        malformed_every: int = 0,
        seed: int = 7,
        values: Iterator[bytes] | None = None,
    ):
        super().__init__(daemon=True, name=f"produce-{topic}")
        from confluent_kafka import Producer

        self.topic = topic
        self.rate = rate
        self._producer = Producer(
            {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True}
        )
        self._values = values if values is not None else order_values(seed, malformed_every=malformed_every)
        self._halt = threading.Event()
        self.acked = 0
        self.errors = 0

    def _delivered(self, err: object, _msg: object) -> None:
        if err is None:
            self.acked += 1
        else:
            self.errors += 1

    def run(self) -> None:
        sent, started = 0, time.monotonic()
        while not self._halt.is_set():
            due = int((time.monotonic() - started) * self.rate) - sent
            for _ in range(max(due, 0)):
                self._producer.produce(self.topic, value=next(self._values), on_delivery=self._delivered)
                sent += 1
            self._producer.poll(0.05)
        self._producer.flush(30)
        self._producer.close()  # else it retries the broker, logging each try, after the demo stops Kafka

    def stop(self) -> None:
        self._halt.set()
        self.join(60)
