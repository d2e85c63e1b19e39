"""The driver of a router: one SparkSession, and a streaming query per set of topics with the same query-level
settings (settings.py), each splitting its micro-batches among its topics' workers (router/topic).

- `launch.py`: from the command's settings to the topics' outcomes; `run.py`: the driver, its queries on
  threads of their own, restarted after a failure, one maintenance thread, the signals;
- `query.py`: one query over named topics or a pattern; `members.py`: its topics' workers; `batch.py`: one
  micro-batch, written by the one job (router/together.py); `floors.py`: where a topic new to the checkpoint
  starts; `behind.py`: a topic that fails, set aside by Kafka range and caught up;
- `named.py`: named topics grouped into queries; `settings.py`: a query's own settings.
"""
