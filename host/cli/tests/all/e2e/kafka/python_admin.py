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
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
