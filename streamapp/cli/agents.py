"""``streamapp agents``: what each agent of the app consumes, keeps, sends and does on failure."""

from __future__ import annotations

import click
import orjson

from .main import app_option, load_app, main


@main.command()
@app_option
def agents(app_ref: str) -> None:
    """List the app's agents: topic, tables and their versions, reads, sinks, failure
    policy and history, one JSON object per agent."""
    app = load_app(app_ref)
    for agent in app.agents.values():
        history = agent.history
        out = {
            "agent": agent.name,
            "topic": agent.topic.name,
            "partitions": agent.topic.partitions,
            "tables": [t.name for t in agent.tables],
            "table_versions": {t.name: t.version for t in agent.tables},
            "reads": [t.name for t in agent.reads],
            "sinks": [t.name for t in agent.sinks],
            "changelog": app.changelog_topic(agent),
            "on_failure": repr(agent.on_failure),
            "history": None if history is None else repr(history),
            "filter": None if agent.filter is None else getattr(agent.filter, "__name__", "yes"),
        }
        if agent.group_by is not None:
            out["group_by"] = {
                "source": agent.group_by.source.name,
                "forwarder": agent.group_by.forwarder,
                "key": getattr(agent.group_by.key, "__name__", "yes"),
            }
        click.echo(orjson.dumps(out).decode())
