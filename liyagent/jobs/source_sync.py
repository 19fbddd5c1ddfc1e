"""`source_sync`: page through a source, upserting each page idempotently, then checkpointing
its cursor, so a sync lost mid-way continues from its last page on any worker."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
from pydantic import Field, ValidationInfo, field_validator

from runtime.base import faults
from runtime.base.settings import get_settings
from runtime.sending import http
from runtime.toolbox.job_kinds import JobContext, JobError, JobParams, job
from store.documents import Document, upsert_documents


class SourceSyncParams(JobParams):
    """`source`: `dir:<path>` (files by name, under a root LIYAGENT_SOURCE_ROOTS names) or an
    http(s) URL serving JSON pages."""

    source: str
    page_size: int = Field(10, ge=1, le=500)

    @field_validator("source")
    @classmethod
    def _known_scheme(cls, value: str, info: ValidationInfo) -> str:
        if value == "dir:" or not value.startswith(("dir:", "http://", "https://")):
            raise ValueError("use dir:<path> or an http(s) URL")
        if value.startswith("dir:"):  # refused at the door: nothing is stored
            settings = (info.context or {}).get("settings") or get_settings()
            confined(value[4:], settings.source_roots)
        return value


def confined(path: str, roots: tuple[str, ...]) -> Path:
    """The directory `path` names, symlinks and `..` resolved, when it is one of the deployment's
    source roots (LIYAGENT_SOURCE_ROOTS, resolved the same way) or under one; ValueError naming
    the setting otherwise (and when it names no root at all)."""
    if not roots:
        raise ValueError(
            "dir: sources are off in this deployment (LIYAGENT_SOURCE_ROOTS names no "
            "directory); use an http(s) source, or have the operator name the directories "
            "syncs may read in LIYAGENT_SOURCE_ROOTS"
        )
    if not os.path.isabs(path):
        raise ValueError("a dir: source is an absolute path (dir:/srv/docs/handbook)")
    resolved = Path(path).resolve()
    if not _under(resolved, roots):
        raise ValueError(
            "a dir: source must be one of the directories LIYAGENT_SOURCE_ROOTS names or "
            "under one (symlinks and '..' resolved first)"
        )
    return resolved


def _under(path: Path, roots: tuple[str, ...]) -> bool:
    """Whether `path` (resolved) is a root or under one, each root resolved as it is now."""
    return any(path.is_relative_to(Path(root).resolve()) for root in roots)


def _dir_page(
    source: str, page: int, size: int, ctx: JobContext
) -> tuple[list[Document], int | None]:
    """One page of the files under a `dir:` source, checked against the roots again as the
    worker sees them: a file whose link leads out of them is left out, never read."""
    roots = ctx.services.settings.source_roots
    try:
        root = confined(source[4:], roots)
    except ValueError as exc:
        raise JobError(f"source {source}: {exc}") from None
    if not root.is_dir():
        raise JobError(f"source {source}: not a directory")
    files = sorted(p for p in root.rglob("*") if p.is_file())
    chunk = files[page * size : (page + 1) * size]
    docs = []
    for p in chunk:
        real = p.resolve()  # read where the link leads, once that is found inside the roots
        if not _under(real, roots):
            ctx.count("outside_roots")
            continue
        docs.append(Document(str(p.relative_to(root)), p.name, real.read_text(errors="replace")))
    return docs, (page + 1 if (page + 1) * size < len(files) else None)


def _fetch_page(
    source: str, page: int, size: int, ctx: JobContext
) -> tuple[list[Document], int | None]:
    """One page of a source: `dir:<path>` (files by name) or `http(s)://...` (JSON pages)."""
    if source.startswith("dir:"):
        return _dir_page(source, page, size, ctx)
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
        "files_outside_roots": ctx.count_of("outside_roots"),
    }
