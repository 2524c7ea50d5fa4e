"""A MiniWoB++ page as the model reads it, and the script that starts its episode.

The elements and their refs are MiniWoB's own (`core.getDOMInfo()`: every visible element, its
ref stamped on it for the episode, so the same element keeps its ref from step to step); this
module only makes them compact text, one line per element, indented by depth:

    Task: Enter "Kasey" into the text field and press Submit.
    [1] body
     [2] div#wrap
      [3] div#area
       [4] div#form
        [5] input_text#tt value=""
        [6] button#subbtn "Submit"

Text that sits between elements has no ref (MiniWoB numbers it afresh on every read) and is
shown quoted on a line of its own.
"""

from __future__ import annotations

import json
from typing import Any

from forge_bridge.envs.tool import bounded

START_JS = r"""({seed, mode, ms}) => {
  Math.seedrandom(seed);
  core.setDataMode(mode);
  core.EPISODE_MAX_TIME = ms === null ? 2147483647 : ms;  // the page's own setting is replaced
  core.startEpisodeReal();
  if (ms === null) {  // the clock stopped: endEpisode still scores (it needs a non-null timer)
    clearTimeout(core.EP_TIMER);
    core.EP_TIMER = 'stopped';
    core.clearTimer();
  }
  return 'e' + WOB_EPISODE_ID;
}"""
"""Seeds the page, sets its data mode and clock, starts MiniWoB's episode; returns the episode
stamp its elements' refs carry (`data-wob_eps`)."""

PAGE_JS = r"""() => {
  const squash = s => String(s === undefined || s === null ? '' : s).replace(/\s+/g, ' ').trim();
  function compact(info) {
    const el = info.ref > 0 ? core.previousDOMInfo[info.ref] : null;
    const node = {ref: info.ref, tag: String(info.tag).toLowerCase(), id: squash(info.id), text: squash(info.text),
                  children: []};
    if ('value' in info) node.value = info.value;
    if (info.focused && info.tag !== 'BODY') node.focused = true;
    if (el && el.tagName === 'SELECT') {
      node.options = [...el.options].map(o => squash(o.text));
      node.selected = el.selectedIndex >= 0 ? squash(el.options[el.selectedIndex].text) : '';
    } else node.children = (info.children || []).map(compact);
    return node;
  }
  const tree = core.getDOMInfo();
  return {utterance: core.getUtterance(), tree: tree ? compact(tree) : null};
}"""
"""The instruction and MiniWoB's element tree, cut to what `dom_text` shows."""

MAX_TEXT = 100
"""An element's text is cut to this many characters (a page's long paragraphs)."""


def quoted(text: str) -> str:
    return json.dumps(text[:MAX_TEXT] + ("..." if len(text) > MAX_TEXT else ""), ensure_ascii=False)


def element_line(node: dict) -> str:
    """One element: `[ref] tag#id "text"`, then its value, checked state or options."""
    if node["ref"] < 0:  # a run of text between elements: no ref of its own
        return quoted(node["text"])
    parts = [f"[{node['ref']}] {node['tag']}" + (f"#{node['id']}" if node["id"] else "")]
    if node["text"]:
        parts.append(quoted(node["text"]))
    value = node.get("value")
    if isinstance(value, bool):
        parts.append("checked" if value else "unchecked")
    elif value is not None:
        parts.append(f"value={quoted(str(value))}")
    if "options" in node:
        parts.append("options: " + " | ".join(quoted(o) for o in node["options"]))
        parts.append(f"selected={quoted(node['selected'])}")
    if node.get("focused"):
        parts.append("(focused)")
    return " ".join(parts)


def dom_text(utterance: str, tree: dict[str, Any] | None, limit: int) -> str:
    """The instruction and the page, one line per element, cut to `limit` characters."""
    lines = [f"Task: {utterance}"]

    def walk(node: dict, depth: int) -> None:
        lines.append(" " * depth + element_line(node))
        for child in node.get("children", []):
            walk(child, depth + 1)

    if tree is None:
        lines.append("(the page shows nothing)")
    else:
        walk(tree, 0)
    return bounded("\n".join(lines), limit)


__all__ = ["MAX_TEXT", "PAGE_JS", "START_JS", "dom_text", "element_line"]
