"""`source_sync`: page through a source, upserting each page idempotently, then checkpointing
its cursor, so a sync lost mid-way continues from its last page on any worker."""

from __future__ import annotations

from pathlib import Path

import httpx
from pydantic import Field, field_validator

from runtime.base import faults
from runtime.sending import http
from runtime.toolbox.job_kinds import JobContext, JobError, JobParams, job
from store.documents import Document, upsert_documents


class SourceSyncParams(JobParams):
    """`source`: `dir:<path>` (files by name) or an http(s) URL serving JSON pages."""

    source: str
    page_size: int = Field(10, ge=1, le=500)

    @field_validator("source")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        if value == "dir:" or not value.startswith(("dir:", "http://", "https://")):
            raise ValueError("use dir:<path> or an http(s) URL")
        return value


def _fetch_page(
    source: str, page: int, size: int, ctx: JobContext
) -> tuple[list[Document], int | None]:
    """One page of a source: `dir:<path>` (files by name) or `http(s)://...` (JSON pages)."""
    if source.startswith("dir:"):
        root = Path(source[4:])
        if not root.is_dir():
            raise JobError(f"source {source}: not a directory")
        files = sorted(p for p in root.rglob("*") if p.is_file())
        chunk = files[page * size : (page + 1) * size]
        docs = [
            Document(str(p.relative_to(root)), p.name, p.read_text(errors="replace")) for p in chunk
        ]
        return docs, (page + 1 if (page + 1) * size < len(files) else None)
    try:
        response = http.shared_client().get(
            source,
            params={"page": page, "size": size},
            headers={"X-Liyagent-Run": ctx.run_id, "X-Liyagent-Attempt": str(ctx.attempt)},
            timeout=ctx.services.settings.timings.call_timeout_s,
        )
        response.raise_for_status()
        body = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise JobError(f"source {source}: page {page} could not be read ({exc})") from exc
    docs = [
        Document(str(d["id"]), str(d.get("title", d["id"])), str(d.get("content", "")))
        for d in body.get("docs", [])
    ]
    nxt = body.get("next")
    return docs, (int(nxt) if nxt is not None else None)


@job(kind="source_sync", resumable=True)
def source_sync(ctx: JobContext, params: SourceSyncParams) -> dict[str, object]:
    """Page through a source, upserting each page idempotently, then checkpointing the cursor."""
    page: int | None = int(ctx.cursor.get("page", 0))
    while page is not None:
        ctx.boundary()
        docs, nxt = _fetch_page(params.source, page, params.page_size, ctx)
        with ctx.services.engine.connect() as conn:
            changed = upsert_documents(
                conn, run_id=ctx.run_id, attempt=ctx.attempt, source=params.source, docs=docs
            )
        ctx.count("pages")
        ctx.count("documents", len(docs))
        ctx.count("changed", changed)
        faults.point("after_page")
        ctx.cursor["page"], page = nxt, nxt
        ctx.checkpoint()
    return {
        "source": params.source,
        "pages": ctx.count_of("pages"),
        "documents_seen": ctx.count_of("documents"),
        "documents_changed": ctx.count_of("changed"),
    }
