"""The report: every page's data gathered once and rendered into one self-contained file."""

from __future__ import annotations

from app.web import data, pages

__all__ = ["build_report"]


def build_report(src: data.Source) -> str:
    """Fleet, money, reliability and each job's page (in the order submitted) as one HTML string."""
    from app.jobs import JobStore

    fleet = data.fleet(src)
    jobs = [data.job_page(src, rec.job_id) for rec in JobStore(src.engine).list()]
    return pages.report_html(fleet, data.money(src), data.reliability(src), jobs)
