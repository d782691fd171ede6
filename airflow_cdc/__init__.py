"""airflow-cdc: Debezium-grade change data capture for Apache Airflow, without Kafka."""

__version__ = "0.1.0"
