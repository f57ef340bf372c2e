"""A driver's exit as the operator sees it, for tests without a kubelet: the CLI's last words, then status.

`run_as_driver` runs `icefall <args>` as a driver container does, with a termination-message file (the
kubelet creates `/dev/termination-log`; here a file of the test's, empty, so the CLI writes to it as in a
pod and never creates it itself). `conditions_after_exit` then takes what the Pod's status would say (the
exit code and that message, `state.terminated`) through the operator's own code: `plan.driver.
driver_pod_from_object`, `plan.driver.decide` and `controller.status.derive`. Not covered: the kubelet
copying the file into the Pod's status, and the API round trip (the e2e tier).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

from icefall.api import ConditionReason, ConditionStatus, ConditionType, StreamingTable
from icefall.controller.status import derive
from icefall.plan.driver import DriverHistory, DriverState, decide, driver_pod_from_object
from icefall.plan.names import LABEL_SPEC_HASH

# The CLI with its termination-message file moved to argv[1] (the constant is read when the CLI writes).
_IN_A_POD = (
    "import sys\n"
    "from icefall.runtime import failpoints\n"
    "failpoints.TERMINATION_MESSAGE_FILE = sys.argv.pop(1)\n"
    "from icefall.cli import main\n"
    "sys.exit(main())\n"
)
_SPEC_HASH = "spec-1"


def run_as_driver(
    args: Sequence[str], env: Mapping[str, str], termination_log: Path, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """`icefall <args>` to its end, with this process's environment and `env`, its last words going to
    `termination_log` (made empty first)."""
    termination_log.write_text("")
    return subprocess.run(
        [sys.executable, "-c", _IN_A_POD, str(termination_log), *args],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


Conditions = dict[ConditionType, tuple[ConditionStatus, ConditionReason, str]]


def conditions_after_exit(st: StreamingTable, *, exit_code: int, last_words: str) -> Conditions:
    """The conditions the operator derives for `st` once its driver Pod failed with `exit_code` and
    `last_words` as its termination message (the next driver backed off)."""
    now = datetime.now(UTC)
    pod = driver_pod_from_object(
        {
            "metadata": {"uid": "driver-1", "labels": {LABEL_SPEC_HASH: _SPEC_HASH}},
            "status": {
                "phase": "Failed",
                "containerStatuses": [
                    {
                        "state": {
                            "terminated": {"exitCode": exit_code, "reason": "Error", "message": last_words}
                        }
                    }
                ],
            },
        }
    )
    decision = decide(pod, desired_hash=_SPEC_HASH, history=DriverHistory(), now=now)
    assert decision.state is DriverState.BACKING_OFF, decision
    derived = derive(st, decision, problems=(), owner=None, now=now)
    return {c.type: (c.status, c.reason, c.message) for c in derived.status.conditions}
