"""Deploying bergstream: spark-submit and Kubernetes rendering, and the files every deployment loads.

The Prometheus scrape configuration and alert rules (with their unit tests) and the Grafana dashboard ship
inside the package, so that the installed command finds them wherever it runs.
"""

from pathlib import Path

# The settings files of the example topics and applications (deploy/topics, deploy/apps), which the demo
# runs: a wheel carries them here (setup.py copies them), a checkout has them beside this package's root.
_SHIPPED = Path(__file__).parent
_CHECKOUT = Path(__file__).resolve().parents[3]
EXAMPLE_TOPICS_DIR = _SHIPPED / "topics" if (_SHIPPED / "topics").is_dir() else _CHECKOUT / "topics"
EXAMPLE_APPS_DIR = _SHIPPED / "apps" if (_SHIPPED / "apps").is_dir() else _CHECKOUT / "apps"
PROMETHEUS_DIR = Path(__file__).parent / "prometheus"
ALERT_RULES = PROMETHEUS_DIR / "alerts.yml"
DASHBOARD = Path(__file__).parent / "grafana" / "bergstream-router.json"
