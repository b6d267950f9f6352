"""``report.html``: the page a person opens after an evaluate stage, one writer for every pack.

It names the run (the folder's name, not its path), the pack, the model, the data evaluated and
the date; shows the metrics, then one row per item with its media as thumbnails and players
(``<img>``, ``<video controls>``, ``<audio controls>``), the user's words as they wrote them
(not the chat template the model read), the reference and the answer; the run's config sits
collapsed at the end. Everything taken from data or config is HTML-escaped.

Media are referenced by paths relative to the report, to files inside the stage folder:
:func:`keep_media` hard-links the input files there (a copy where a link cannot be made,
across file systems). A link costs no disk and, unlike a symlink, still holds the bytes when
the run folder is copied or archived to another machine, where absolute paths would point
nowhere.
"""

from __future__ import annotations

import datetime
import hashlib
import html
import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence
from urllib.parse import quote

IMAGE = {".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp"}
VIDEO = {".mp4", ".webm", ".mov", ".m4v", ".ogv", ".mkv", ".avi"}
AUDIO = {".wav", ".mp3", ".flac", ".ogg", ".oga", ".opus", ".m4a", ".aac"}

STYLE = (
    "body{font-family:sans-serif;margin:2em;max-width:80em}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;"
    "vertical-align:top}table{border-collapse:collapse}.miss{background:#fee}.about{color:#555}"
    ".media img{max-width:160px;max-height:160px;image-rendering:pixelated;display:block}"
    ".media video{width:256px;image-rendering:pixelated;display:block}.turn{white-space:pre-wrap}th{white-space:nowrap}"
    ".turn,.text{max-width:40em;min-width:10em;overflow-wrap:anywhere}"
    "pre{background:#f6f6f6;padding:1em;overflow:auto}"
)


#: Cells of free text: the user's turn keeps its lines; long unbroken model output wraps instead of widening the page.
CLASSES = {"prompt": " class='turn'", "caption": " class='turn'", "reference": " class='text'", "prediction": " class='text'"}


def media_kind(path: str | Path) -> str | None:
    """``"image"``, ``"video"`` or ``"audio"`` by the file's suffix; None for anything else."""
    suffix = Path(path).suffix.lower()
    return "image" if suffix in IMAGE else "video" if suffix in VIDEO else "audio" if suffix in AUDIO else None


def keep_media(folder: Path, files: Iterable[str | Path], *, under: str = "media") -> list[dict[str, str]]:
    """Link (else copy) ``files`` into ``folder/under`` and return ``[{"kind", "src"}]`` with
    ``src`` relative to ``folder``, for a row's ``media``. The same source file is kept once;
    missing files and kinds a browser cannot show are left out."""
    target = folder / under
    kept: list[dict[str, str]] = []
    for file in map(Path, files):
        kind = media_kind(file)
        if kind is None or not file.is_file():
            continue
        # the name carries a short hash of the source path: two "0001.png" of different folders stay apart
        name = f"{hashlib.sha256(str(file.resolve()).encode()).hexdigest()[:8]}-{file.name}" if (target / file.name).exists() and not _same(target / file.name, file) else file.name
        dest = target / name
        if not dest.exists():
            target.mkdir(parents=True, exist_ok=True)
            try:
                os.link(file, dest)
            except OSError:  # another file system, or links not allowed there
                shutil.copyfile(file, dest)
        kept.append({"kind": kind, "src": f"{under}/{name}"})
    return kept


def _same(a: Path, b: Path) -> bool:
    try:
        return a.samefile(b) or (a.stat().st_size == b.stat().st_size and a.read_bytes() == b.read_bytes())
    except OSError:
        return False


def user_text(turns: Iterable[Any], placeholders: Iterable[str] = ("<image>", "<video>", "<audio>")) -> str:
    """The user's words up to the last answer, as they wrote them: each user turn on its own
    lines, media placeholders dropped (the media are shown beside them)."""
    pairs = [(t.role, t.content) if hasattr(t, "role") else (t[0], t[1]) for t in turns]
    last_answer = max((i for i, (role, _) in enumerate(pairs) if role == "assistant"), default=len(pairs))
    said = [text for role, text in pairs[:last_answer] if role == "user"]
    for mark in placeholders:
        said = [text.replace(mark, "") for text in said]
    return "\n".join(text.strip() for text in said if text.strip())


def held_out_sources(ctx: Any, upstream: Mapping[str, Any], read: Callable[[Path], Iterable[Any]]) -> dict[str, Any]:
    """``"file:index"`` -> the raw item (with ``file`` and ``index``) of the evaluated data, read
    again with the pack's reader ``read``: the user's own words and media files, which the
    encoded samples no longer hold. From ``evaluate.datasets``, else the files preprocess read;
    empty where they are gone (the report then shows no media)."""
    files = [Path(p) for p in (ctx.config.evaluate.datasets or upstream["preprocess"].inputs)]
    files = [f for d in files for f in (sorted(d.glob("*.json*")) if d.is_dir() else [d])]
    found: dict[str, Any] = {}
    for path in files:
        try:
            found.update({f"{Path(item.file).name}:{item.index}": item for item in read(path) if hasattr(item, "index") and not hasattr(item, "reason")})  # not a BadSample
        except (OSError, ValueError):  # moved or changed since: the report still has every number
            continue
    return found


def write_results(
    folder: Path,
    rows: Sequence[Mapping[str, Any]],
    metrics: Mapping[str, Any],
    *,
    title: str,
    columns: Sequence[str],
    images: Sequence[tuple[str, str]] = (),
    ctx: Any = None,
    dataset: str | None = None,
) -> None:
    """``results.jsonl`` (one row per item), ``metrics.json`` and ``report.html``.

    Args:
        rows: one mapping per item; a row's ``media`` (``[{"kind", "src"}]``, :func:`keep_media`)
            is drawn as players in the first column, its ``prompt`` as the user's turn.
        title: the heading without a stage context (a run's report is titled with the run's name).
        columns: which fields of the rows the table shows, in order.
        images: (file relative to ``folder``, caption) pictures shown above the table.
        ctx: the evaluate stage's context: the run's name, pack, model, date and config.
        dataset: what was evaluated (default: ``evaluate.datasets``, else the held-out split of
            the files preprocess read).
    """
    from mmcore.framework.files import atomic_write_json, atomic_write_text

    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / "results.jsonl", "".join(json.dumps(dict(r), ensure_ascii=False) + "\n" for r in rows))
    atomic_write_json(folder / "metrics.json", dict(metrics))
    atomic_write_text(folder / "report.html", render(rows, metrics, title=title, columns=columns, images=images, ctx=ctx, dataset=dataset))


def render(
    rows: Sequence[Mapping[str, Any]], metrics: Mapping[str, Any], *, title: str, columns: Sequence[str], images: Sequence[tuple[str, str]] = (), ctx: Any = None, dataset: str | None = None
) -> str:
    """The page :func:`write_results` writes."""
    e = html.escape
    name = ctx.run_dir.name if ctx is not None else title
    page = ["<!doctype html><meta charset='utf-8'>", f"<title>{e(name)}</title>", f"<style>{STYLE}</style>", f"<h1>{e(name)}</h1>"]
    if ctx is not None:
        about = [
            ("pack", ctx.pack),
            ("model", str(getattr(ctx.config.model, "source", ""))),
            ("data", dataset or evaluated_data(ctx, rows)),
            ("date", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")),
        ]
        page.append("<p class='about'>" + " &middot; ".join(f"{k}: <b>{e(v)}</b>" for k, v in about) + f"<br>{e(title)}</p>")
    page.append("<table>" + "".join(f"<tr><th>{e(str(k))}</th><td>{e(_shown(v))}</td></tr>" for k, v in metrics.items()) + "</table>")
    for src, caption in images:
        page.append(f"<figure><img src='{e(src)}' style='image-rendering:pixelated;max-width:100%'><figcaption>{e(caption)}</figcaption></figure>")
    if rows:
        with_media = any(r.get("media") for r in rows)
        shown = [c for c in columns if c != "media"]
        heads = (["media"] if with_media else []) + shown
        page.append("<h2>Per item</h2><table><tr>" + "".join(f"<th>{e(c)}</th>" for c in heads) + "</tr>")
        for r in rows:
            miss = " class='miss'" if r.get("exact_match") == 0.0 or r.get("error") else ""
            cells = [f"<td class='media'>{media_html(r.get('media') or [])}</td>"] if with_media else []
            cells += [f"<td{CLASSES.get(c, '')}>{e(_shown(r.get(c, '')))}</td>" for c in shown]
            page.append(f"<tr{miss}>{''.join(cells)}</tr>")
        page.append("</table>")
    if ctx is not None:
        import yaml

        text = yaml.safe_dump(ctx.config.model_dump(mode="json"), sort_keys=False)
        page.append(f"<details><summary>config</summary><pre>{e(text)}</pre></details>")
    return "\n".join(page) + "\n"


def media_html(media: Iterable[Mapping[str, str]]) -> str:
    """Thumbnails and players of a row's media (``src`` relative to the report)."""
    out = []
    for item in media:
        src = html.escape(quote(item["src"]), quote=True)  # a file named "a b#1.png" is still found
        if item["kind"] == "image":
            out.append(f"<a href='{src}'><img src='{src}' alt='{src}'></a>")
        elif item["kind"] == "video":
            out.append(f"<video controls loop muted preload='metadata' src='{src}'></video>")
        elif item["kind"] == "audio":
            out.append(f"<audio controls preload='metadata' src='{src}'></audio>")
    return "".join(out)


def evaluated_data(ctx: Any, rows: Sequence[Mapping[str, Any]] = ()) -> str:
    """What the evaluate stage read: ``evaluate.datasets`` by name, else the files the held-out
    items came from (their ``item`` is ``file:index``)."""
    chosen = list(getattr(ctx.config.evaluate, "datasets", []) or [])
    if chosen:
        return ", ".join(Path(p).name for p in chosen)
    files = sorted({str(r["item"]).rsplit(":", 1)[0] for r in rows if ":" in str(r.get("item", ""))})
    return "held-out items of " + ", ".join(files) if files else "held-out split"


def _shown(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


__all__ = ["held_out_sources", "keep_media", "media_html", "media_kind", "render", "user_text", "write_results"]
