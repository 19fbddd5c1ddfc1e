"""Documents written by source syncs: upserted by (source, doc id), fenced on the attempt."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import sqlalchemy as sa

from store.db import sql
from store.rows import FencedOut
from store.runs import OWNER_CTE


@dataclass(frozen=True)
class Document:
    doc_id: str
    title: str
    content: str

    @property
    def content_hash(self) -> str:
        return hashlib.sha256(f"{self.title}\x1f{self.content}".encode()).hexdigest()


def upsert_documents(
    conn: sa.Connection, *, run_id: str, attempt: int, source: str, docs: list[Document]
) -> int:
    """Upsert one page, only while this attempt owns the run (I3). A page synced again
    changes nothing: the version moves only when the content does. Returns rows changed."""
    payload = json.dumps(
        [
            {"doc_id": d.doc_id, "title": d.title, "content": d.content, "hash": d.content_hash}
            for d in docs
        ]
    )
    row = conn.execute(
        sql(
            f"""
            WITH {OWNER_CTE},
            page AS (
                SELECT * FROM jsonb_to_recordset(CAST(:docs AS jsonb))
                    AS p(doc_id text, title text, content text, hash text)),
            up AS (
                INSERT INTO documents (source, doc_id, title, content, content_hash, synced_by)
                SELECT :source, page.doc_id, page.title, page.content, page.hash, owner.id
                FROM page, owner
                ON CONFLICT (source, doc_id) DO UPDATE
                    SET title = excluded.title, content = excluded.content,
                        content_hash = excluded.content_hash, version = documents.version + 1,
                        synced_by = excluded.synced_by, updated_at = now()
                    WHERE documents.content_hash <> excluded.content_hash
                RETURNING 1)
            SELECT (SELECT count(*) FROM owner) AS owned, (SELECT count(*) FROM up) AS changed
            """
        ),
        {"run_id": run_id, "attempt": attempt, "source": source, "docs": payload},
    ).one()
    if not row.owned:
        raise FencedOut(run_id, attempt, f"sync a page of {source}")
    return int(row.changed)
