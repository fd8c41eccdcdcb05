"""Drives kafka-python against a narad Kafka listener for tests/all/kafka.rs.

Produces keyed records with headers using the producer's default settings (idempotence is
on by default in kafka-python 3), then reads every partition back with a consumer on
explicitly assigned partitions (no consumer group), and prints one JSON document: what was
produced (with the partition and offset each send was acknowledged with), what was
consumed, and the producer id the producer was given. Bytes are hex so nothing is lost; a
null value (every tenth record is a tombstone) is JSON null, and every tenth, offset by five,
has an empty value.

usage: python_round_trip.py BOOTSTRAP TOPIC PARTITIONS RECORDS
"""

import json
import sys

from kafka import KafkaConsumer, KafkaProducer, TopicPartition


def main():
    bootstrap, topic, partitions, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    sent = []
    for i in range(count):
        key = b"key-%d" % (i % 11)
        # Values with every byte value, so any re-encoding would show.
        value = bytes([i % 256]) + b"value-%d-" % i + bytes(range(256))
        if i % 10 == 9:
            value = None
        elif i % 10 == 4:
            value = b""
        headers = [("seq", str(i).encode()), ("bin", bytes([0, 255, i % 256]))]
        future = producer.send(topic, key=key, value=value, headers=headers)
        sent.append((key, value, headers, future))
    producer.flush()
    produced = []
    for key, value, headers, future in sent:
        meta = future.get(timeout=30)
        produced.append({
            "key": key.hex(),
            "value": value.hex() if value is not None else None,
            "headers": [[n, v.hex()] for n, v in headers],
            "partition": meta.partition,
            "offset": meta.offset,
        })
    manager = producer._transaction_manager
    producer_id = manager.producer_id_and_epoch.producer_id if manager is not None else -1
    producer.close()

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        consumer_timeout_ms=5000,
    )
    consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
    consumer.seek_to_beginning()
    consumed = []
    for message in consumer:
        consumed.append({
            "key": message.key.hex() if message.key is not None else None,
            "value": message.value.hex() if message.value is not None else None,
            "headers": [[n, v.hex()] for n, v in message.headers],
            "partition": message.partition,
            "offset": message.offset,
            "timestamp": message.timestamp,
            "timestamp_type": message.timestamp_type,
        })
        if len(consumed) >= count:
            break
    consumer.close()
    json.dump({"produced": produced, "consumed": consumed, "producer_id": producer_id}, sys.stdout)


if __name__ == "__main__":
    main()
