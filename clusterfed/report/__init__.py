"""Run folders -> tables, plots and a report page."""

from clusterfed.report.pages import write_report

__all__ = ["write_report"]
