# Airflow 3 with the airflow-cdc provider, PySpark (spark-submit) and a JRE for it; FreeTDS's ODBC
# driver (tdsodbc) for the SQL Server source.
FROM apache/airflow:3.3.2-python3.11
USER root
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless tdsodbc unixodbc \
 && rm -rf /var/lib/apt/lists/*
ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64
USER airflow
COPY --chown=airflow:root pyproject.toml README.md /opt/airflow-cdc/
COPY --chown=airflow:root airflow_cdc /opt/airflow-cdc/airflow_cdc
COPY --chown=airflow:root spark_jobs /opt/airflow-cdc/spark_jobs
RUN pip install --no-cache-dir "/opt/airflow-cdc[spark,sqlserver]" \
    "apache-airflow==3.3.2" "apache-airflow-providers-apache-spark==6.3.4"
