"""A consumer in a group (kafka-python or confluent-kafka), or an admin query, for the e2e
tests.

consume BOOTSTRAP TOPIC GROUP IDLE_SECS
    Subscribes as a kafka-python member of GROUP, commits (synchronously) after every poll
    that brought records, and prints one JSON line per event: {"assigned": [partitions]} when
    its assignment changes, {"p": partition, "o": offset, "v": value} per record. Exits
    (leaving the group) once it has read a record and then IDLE_SECS pass without one, or
    after 50 s.

consume-librdkafka BOOTSTRAP TOPIC GROUP IDLE_SECS STRATEGY
    The same as a confluent-kafka (librdkafka) member whose partition.assignment.strategy is
    STRATEGY.

offsets BOOTSTRAP GROUP
    Prints {"groups": [...], "offsets": {"topic/partition": offset}} from the admin client.
"""

import json
import sys
import time

from kafka import KafkaAdminClient, KafkaConsumer


def emit(event):
    print(json.dumps(event), flush=True)


def consume(bootstrap, topic, group, idle_secs):
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=6000,
        heartbeat_interval_ms=500,
        max_poll_interval_ms=20000,
        request_timeout_ms=30000,
    )
    assigned = None
    last_record = None
    started = time.time()
    while time.time() - started < 50:
        batches = consumer.poll(timeout_ms=200)
        now_assigned = sorted(tp.partition for tp in consumer.assignment())
        if now_assigned != assigned:
            assigned = now_assigned
            emit({"assigned": assigned})
        got = False
        for records in batches.values():
            for record in records:
                got = True
                emit({"p": record.partition, "o": record.offset, "v": record.value.decode()})
        if got:
            consumer.commit()
            last_record = time.time()
        elif last_record is not None and time.time() - last_record > idle_secs:
            break
    consumer.close()


def consume_librdkafka(bootstrap, topic, group, idle_secs, strategy):
    from confluent_kafka import Consumer

    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
        "max.poll.interval.ms": 20000,
        "partition.assignment.strategy": strategy,
    })
    consumer.subscribe([topic])
    assigned = None
    last_record = None
    started = time.time()
    while time.time() - started < 50:
        records = consumer.consume(num_messages=500, timeout=0.2)
        now_assigned = sorted(tp.partition for tp in consumer.assignment())
        if now_assigned != assigned:
            assigned = now_assigned
            emit({"assigned": assigned})
        got = False
        for record in records:
            if record.error() is not None:
                emit({"error": str(record.error())})
                continue
            got = True
            emit({"p": record.partition(), "o": record.offset(), "v": record.value().decode()})
        if got:
            consumer.commit(asynchronous=False)
            last_record = time.time()
        elif last_record is not None and time.time() - last_record > idle_secs:
            break
    consumer.close()


def offsets(bootstrap, group):
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    listed = admin.list_groups()
    groups = sorted(g["group_id"] if isinstance(g, dict) else g[0] for g in listed)
    found = admin.list_group_offsets({group: None})[group]
    emit({
        "groups": groups,
        "offsets": {f"{tp.topic}/{tp.partition}": meta.offset for tp, meta in found.items()},
    })
    admin.close()


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "consume":
        consume(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]))
    elif mode == "consume-librdkafka":
        consume_librdkafka(
            sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]), sys.argv[6]
        )
    elif mode == "offsets":
        offsets(sys.argv[2], sys.argv[3])
    else:
        sys.exit(f"unknown mode {mode}")
