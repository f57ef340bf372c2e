"""The local stack: real Kafka, kube-apiserver + etcd, started from the project's own provisioned binaries."""
