"""Deploying bergstream: spark-submit and Kubernetes rendering, and the files every deployment loads.

The Prometheus scrape configuration and alert rules (with their unit tests) and the Grafana dashboard ship
inside the package, so that the installed command finds them wherever it runs.
"""

from pathlib import Path

PROMETHEUS_DIR = Path(__file__).parent / "prometheus"
ALERT_RULES = PROMETHEUS_DIR / "alerts.yml"
DASHBOARD = Path(__file__).parent / "grafana" / "bergstream-router.json"
