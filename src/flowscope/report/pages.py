"""The names of a run's analysis pages on the dashboard and in the offline file (its overview is the page "")."""

from __future__ import annotations

PAGES = ("advisor", "critical-path", "profile", "charts", "anomalies", "logs")
