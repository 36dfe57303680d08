"""Local infrastructure: a single-node Kafka broker from Maven Central jars, topic creation."""
