"""The application runtime: an application's query over named sources, run live (`app run`), bootstrapped
from the archive onto Kafka (`app run --from`) or as a backfill of a window (`backfill run`), and its report.
"""
