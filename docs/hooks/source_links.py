"""MkDocs hook: links from a page to the repository's own files outside docs/.

A page links to `../examples/order_desk/README.md` so that the link works where the page is read
as a file (GitHub, an editor). MkDocs cannot serve such a file and would report the link as
broken, so this hook checks it instead, before MkDocs sees it: a target that is not in the
checkout fails the build (as `--strict` fails a broken link between pages); one that is there
becomes a link into the repository when `repo_url` is set, and its text alone otherwise.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import Files
from mkdocs.structure.pages import Page

# A Markdown link or image whose target is a relative path (no scheme, not an anchor alone).
LINK = re.compile(r"(?P<bang>!?)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s#:]+)(?P<anchor>#[^)\s]*)?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    docs = Path(config.docs_dir).resolve()
    root = docs.parent
    here = Path(page.file.abs_src_path or docs).parent
    repo_url = (config.repo_url or "").rstrip("/")

    def rewrite(match: re.Match[str]) -> str:
        target = (here / match["target"]).resolve()
        if target.is_relative_to(docs):
            return match[0]  # a page or a file of the site: MkDocs checks it
        if not target.is_relative_to(root) or not target.exists():
            raise PluginError(
                f"{page.file.src_uri} links to {match['target']!r}, which is not in the checkout"
            )
        if repo_url:  # HEAD: the repository's default branch, on GitHub and GitLab alike
            path = target.relative_to(root).as_posix() + (match["anchor"] or "")
            return f"{match['bang']}[{match['text']}]({repo_url}/blob/HEAD/{path})"
        return match["text"]

    # Code blocks are shown as written: a link-like line in one is no link.
    parts, last = [], 0
    for block in FENCE.finditer(markdown):
        parts.append(LINK.sub(rewrite, markdown[last : block.start()]))
        parts.append(block[0])
        last = block.end()
    parts.append(LINK.sub(rewrite, markdown[last:]))
    return "".join(parts)
