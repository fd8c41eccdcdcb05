"""Creates topics through the Kafka admin APIs, as an application does at its start, for the
e2e tests.

create BOOTSTRAP NAME PARTITIONS RETENTION_MS
    kafka-python's KafkaAdminClient.create_topics, then the same request again. Prints
    {"first": "ok" | error class, "again": "ok" | error class}.

create-librdkafka BOOTSTRAP NAME PARTITIONS
    confluent-kafka's AdminClient.create_topics (librdkafka). Prints {"result": "ok" | error}.

grow BOOTSTRAP NAME COUNT
    kafka-python's create_partitions to COUNT, then to COUNT again. Prints {"first": ...,
    "again": ...} as create does.

delete BOOTSTRAP NAME...
    kafka-python's delete_topics, one call per name. Prints {"NAME": "ok" | error class}.

describe BOOTSTRAP NAME
    kafka-python's describe_configs (every config of topic NAME and of the broker, then of a
    topic that does not exist) and describe_cluster. Prints {"topic": {key: value},
    "sources": {key: source}, "broker": {key: value}, "missing": {key: value} (empty),
    "cluster": {"cluster_id", "controller_id", "brokers": [[id, host, port]]}}.

auto-produce BOOTSTRAP NAME_PY NAME_RD COUNT
    Produces COUNT records to topic NAME_PY, which does not exist yet, with kafka-python's
    KafkaProducer, and COUNT to NAME_RD with confluent-kafka's Producer, as an application
    does on a broker that creates topics on first use. Prints {"python": "ok" | error class,
    "librdkafka": "ok" | error}.

describe-librdkafka BOOTSTRAP NAME
    confluent-kafka's describe_configs of topic NAME and of a topic that does not exist, and
    describe_cluster. Prints {"topic": {key: value}, "missing": "ok" | error, "cluster_id",
    "controller": id, "nodes": [[id, host, port]]}.
"""

import json
import sys


def kafka_python(bootstrap, name, partitions, retention_ms):
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=20000)
    topic = NewTopic(
        name=name,
        num_partitions=partitions,
        replication_factor=1,
        topic_configs={"retention.ms": str(retention_ms)},
    )
    outcome = {}
    for attempt in ("first", "again"):
        try:
            admin.create_topics([topic])
            outcome[attempt] = "ok"
        except Exception as e:  # the class name is what the test checks
            outcome[attempt] = type(e).__name__
    admin.close()
    print(json.dumps(outcome), flush=True)


def librdkafka(bootstrap, name, partitions):
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1)],
        request_timeout=20,
    )
    try:
        futures[name].result(timeout=30)
        result = "ok"
    except Exception as e:
        result = str(e)
    print(json.dumps({"result": result}), flush=True)


def grow(bootstrap, name, count):
    from kafka import KafkaAdminClient
    from kafka.admin import NewPartitions

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=20000)
    outcome = {}
    for attempt in ("first", "again"):
        try:
            admin.create_partitions({name: NewPartitions(total_count=count)})
            outcome[attempt] = "ok"
        except Exception as e:
            outcome[attempt] = type(e).__name__
    admin.close()
    print(json.dumps(outcome), flush=True)


def delete(bootstrap, names):
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=20000)
    outcome = {}
    for name in names:
        try:
            admin.delete_topics([name])
            outcome[name] = "ok"
        except Exception as e:
            outcome[name] = type(e).__name__
    admin.close()
    print(json.dumps(outcome), flush=True)


def describe(bootstrap, name):
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource, ConfigResourceType

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=20000)
    out = {}
    configs = admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, name)], config_filter="all"
    )
    topic = configs["topic"][name]
    out["topic"] = {key: entry["value"] for key, entry in topic.items()}
    out["sources"] = {key: str(entry.get("config_source")) for key, entry in topic.items()}
    cluster = admin.describe_cluster()
    broker_id = cluster["controller_id"]
    configs = admin.describe_configs(
        [ConfigResource(ConfigResourceType.BROKER, str(broker_id))], config_filter="all"
    )
    out["broker"] = {
        key: entry["value"] for key, entry in configs["broker"][str(broker_id)].items()
    }
    # kafka-python passes a resource's error over: its configs are simply empty.
    missing = admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, "no-such-topic")], config_filter="all"
    )
    out["missing"] = missing["topic"]["no-such-topic"]
    out["cluster"] = {
        "cluster_id": cluster["cluster_id"],
        "controller_id": cluster["controller_id"],
        "brokers": sorted(
            [b["broker_id"], b["host"], b["port"]] for b in cluster["brokers"]
        ),
    }
    admin.close()
    print(json.dumps(out), flush=True)


def describe_librdkafka(bootstrap, name):
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.describe_configs([ConfigResource("topic", name)], request_timeout=20)
    out = {}
    for _, future in futures.items():
        entries = future.result(timeout=30)
        out["topic"] = {key: entry.value for key, entry in entries.items()}
    futures = admin.describe_configs(
        [ConfigResource("topic", "no-such-topic")], request_timeout=20
    )
    for _, future in futures.items():
        try:
            future.result(timeout=30)
            out["missing"] = "ok"
        except Exception as e:
            out["missing"] = str(e)
    cluster = admin.describe_cluster(request_timeout=20).result(timeout=30)
    out["cluster_id"] = cluster.cluster_id
    out["controller"] = cluster.controller.id if cluster.controller else None
    out["nodes"] = sorted([n.id, n.host, n.port] for n in cluster.nodes)
    print(json.dumps(out), flush=True)


def auto_produce(bootstrap, name_py, name_rd, count):
    from confluent_kafka import Producer
    from kafka import KafkaProducer

    out = {}
    try:
        producer = KafkaProducer(bootstrap_servers=bootstrap, max_block_ms=20000)
        for i in range(count):
            producer.send(name_py, value=f"py-{i}".encode()).get(timeout=20)
        producer.close()
        out["python"] = "ok"
    except Exception as e:
        out["python"] = type(e).__name__
    errors = []
    producer = Producer(
        {"bootstrap.servers": bootstrap, "message.timeout.ms": 20000}
    )
    for i in range(count):
        producer.produce(
            name_rd,
            value=f"rd-{i}".encode(),
            on_delivery=lambda err, _msg: err and errors.append(str(err)),
        )
    left = producer.flush(30)
    out["librdkafka"] = "ok" if not errors and left == 0 else (errors or [f"{left} unsent"])[0]
    print(json.dumps(out), flush=True)


def main():
    mode = sys.argv[1]
    if mode == "create":
        kafka_python(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    elif mode == "create-librdkafka":
        librdkafka(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif mode == "grow":
        grow(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif mode == "delete":
        delete(sys.argv[2], sys.argv[3:])
    elif mode == "describe":
        describe(sys.argv[2], sys.argv[3])
    elif mode == "describe-librdkafka":
        describe_librdkafka(sys.argv[2], sys.argv[3])
    elif mode == "auto-produce":
        auto_produce(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
