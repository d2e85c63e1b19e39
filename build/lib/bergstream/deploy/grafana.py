"""The Grafana dashboard of the routers, written to bergstream/deploy/grafana/bergstream-router.json.

    python -m bergstream.deploy.grafana     # rewrites the JSON after a change here

One row of panels per concern an operator has: is the router keeping up, is the archive fresh, is
anything lost or refused, what do batches and commits cost, what lands in storage. Every query uses the
`topic` variable; `$__rate_interval` is Grafana's own.
"""

from __future__ import annotations

import json
from typing import Any

from bergstream.deploy import DASHBOARD

TOPIC = 'topic=~"$topic"'


def _rate(metric: str, by: str = "topic") -> str:
    return f"sum by ({by}) (rate(bergstream_router_{metric}{{{TOPIC}}}[$__rate_interval]))"


def _increase(metric: str, by: str, window: str) -> str:
    return f"sum by ({by}) (increase(bergstream_router_{metric}{{{TOPIC}}}[{window}]))"


# (title, unit, [(legend, PromQL)], description)
PANELS: list[tuple[str, str, list[tuple[str, str]], str]] = [
    (
        "Time lag",
        "s",
        [("{{topic}}", f"max by (topic) (bergstream_router_lag_seconds{{{TOPIC}}})")],
        "How long the first record not yet archived has waited since it was produced, in the partition "
        "furthest behind; 0 when the router has archived everything, however quiet the topic.",
    ),
    (
        "Lag in records, per partition",
        "short",
        [
            (
                "{{topic}} p{{partition}}",
                f"sum by (topic, partition) (bergstream_router_lag_offsets{{{TOPIC}}})",
            )
        ],
        "Records in Kafka that the router has not archived yet.",
    ),
    (
        "Age of the newest archived record",
        "s",
        [("{{topic}}", f"max by (topic) (bergstream_router_newest_archived_age_seconds{{{TOPIC}}})")],
        "Now minus the newest Kafka timestamp committed to the archive table: how fresh the archive is. "
        "It grows on a quiet topic with nothing to archive; the time lag says whether the router is behind.",
    ),
    (
        "Records per second",
        "ops",
        [
            ("read {{topic}}", _rate("records_read_total")),
            ("archived {{topic}}", _rate("records_archived_total")),
            ("dead-lettered {{topic}}", _rate("records_dead_lettered_total")),
        ],
        "Read from Kafka, appended to the archive table, appended to the dead-letter table.",
    ),
    (
        "Share of records dead-lettered",
        "percentunit",
        [
            (
                "{{topic}}",
                f"{_rate('records_dead_lettered_total')} / {_rate('records_read_total')}",
            )
        ],
        "Records that did not parse or fit the schema; the reasons are in the <table>__dlq table.",
    ),
    (
        "Offsets expired before they were archived",
        "short",
        [
            (
                "{{topic}} p{{partition}}",
                _increase("expired_offsets_total", "topic, partition", "1h"),
            )
        ],
        "Records Kafka deleted before the router read them: lost to the archive. Should stay empty.",
    ),
    (
        "Commits failing on the catalog or the warehouse",
        "s",
        [("{{topic}}", f"max by (topic) (bergstream_router_commit_outage_seconds{{{TOPIC}}})")],
        "How long the router has been retrying its commits because the catalog's database or the "
        "warehouse is unavailable (down, full, read-only); 0 while commits succeed.",
    ),
    (
        "Batch duration",
        "s",
        [
            (
                f"p{q} {{{{topic}}}}",
                f"histogram_quantile({q / 100}, sum by (le, topic) "
                f"(rate(bergstream_router_batch_duration_seconds_bucket{{{TOPIC}}}[$__rate_interval])))",
            )
            for q in (50, 99)
        ],
        "Read, parse, append and commit of one micro-batch; above the trigger interval, the router lags.",
    ),
    (
        "Commit latency, per table",
        "s",
        [
            (
                "p99 {{table}}",
                "histogram_quantile(0.99, sum by (le, table) "
                f"(rate(bergstream_router_commit_latency_seconds_bucket{{{TOPIC}}}[$__rate_interval])))",
            )
        ],
        "Writing and committing one table's append.",
    ),
    (
        "Batches per minute",
        "short",
        [
            (
                "{{outcome}} {{topic}}",
                _increase("batches_total", "topic, outcome", "1m"),
            )
        ],
        "Replayed batches were committed before a restart and are not written again.",
    ),
    (
        "Bytes written per second, per table",
        "Bps",
        [
            (
                "{{table}}",
                _rate("bytes_written_total", by="table"),
            )
        ],
        "Parquet committed to the archive and dead-letter tables.",
    ),
    (
        "Files written per minute, per table",
        "short",
        [("{{table}}", _increase("files_written_total", "table", "1m"))],
        "Many small files per hour call for `bergstream router maintain`, or a longer trigger interval.",
    ),
]


def dashboard() -> dict[str, Any]:
    datasource = {"type": "prometheus", "uid": "${datasource}"}
    panels = []
    for index, (title, unit, targets, description) in enumerate(PANELS):
        panels.append(
            {
                "id": index + 1,
                "type": "timeseries",
                "title": title,
                "description": description,
                "datasource": datasource,
                "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
                "targets": [
                    {
                        "refId": chr(ord("A") + n),
                        "datasource": datasource,
                        "expr": expr,
                        "legendFormat": legend,
                    }
                    for n, (legend, expr) in enumerate(targets)
                ],
            }
        )
    return {
        "uid": "bergstream-router",
        "title": "bergstream routers",
        "description": "Kafka topics archived into Iceberg: freshness, lag, throughput, losses, cost.",
        "tags": ["bergstream", "kafka", "iceberg"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
                {
                    "name": "topic",
                    "type": "query",
                    "label": "Topic",
                    "datasource": datasource,
                    "query": {
                        "query": "label_values(bergstream_router_records_read_total, topic)",
                        "refId": "topic",
                    },
                    "definition": "label_values(bergstream_router_records_read_total, topic)",
                    "includeAll": True,
                    "multi": True,
                    "allValue": ".*",
                    "refresh": 2,
                },
            ]
        },
        "panels": panels,
    }


def queries() -> list[str]:
    """Every PromQL expression of the dashboard."""
    return [expr for _, _, targets, _ in PANELS for _, expr in targets]


def main() -> None:
    DASHBOARD.parent.mkdir(parents=True, exist_ok=True)
    DASHBOARD.write_text(json.dumps(dashboard(), indent=2) + "\n")
    print(f"wrote {DASHBOARD}")


if __name__ == "__main__":
    main()
