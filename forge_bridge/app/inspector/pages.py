"""The inspector's pages, rendered on the server as plain HTML (no scripts, nothing fetched from
outside): runs and curves, the trajectory table, one trajectory step by step down to its
tokens, a group side by side, and two adapter versions on the same held-out task."""

from __future__ import annotations

import difflib
import html
import json
import math
import re
import time
import urllib.parse
from typing import Any

from forge_bridge.app.inspector.charts import line_chart
from forge_bridge.app.inspector.data import Filters, RunView, Step, first_divergence
from forge_bridge.core.types import BEHAVIOURS, STATUSES, Action

CURVES = (("reward", ("reward_mean",)), ("success rate", ("success_rate",)), ("KL to the reference", ("kl",)),
          ("clip fraction", ("clip_fraction",)), ("entropy", ("entropy",)), ("trained tokens / s", ("tokens_per_s",)),
          ("seconds: rollouts, update, publish", ("time_rollout_s", "time_update_s", "time_publish_s")),
          ("sampling tokens / s: prefill, decode", ("prefill_tokens_per_s", "decode_tokens_per_s")),
          ("share of the matmul limit: prefill, decode", ("prefill_share_of_limit", "decode_share_of_limit")))
COLOURINGS = ("logprob", "trained", "advantage", "teacher")
PER_PAGE = 50

_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#222}
nav{background:#263238;padding:8px 16px}nav a{color:#fff;margin-right:18px;text-decoration:none;font-weight:600}
main{padding:12px 20px}h1{font-size:20px}h2{font-size:16px;margin-top:22px}
table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f0f0f0}.muted{color:#888}.charts{display:flex;flex-wrap:wrap;gap:12px}
figure.chart{margin:0;border:1px solid #eee;padding:6px}figcaption{font-weight:600;font-size:13px}
text.tick{font-size:10px;fill:#666}.bad{color:#b71c1c}.good{color:#1b5e20}
.step{border:1px solid #ccc;border-radius:6px;margin:14px 0;padding:8px 12px}
.msg{white-space:pre-wrap;background:#f7f7f7;border-left:3px solid #90a4ae;margin:4px 0;padding:4px 8px}
.msg.tool{border-color:#ffb300}.msg.assistant{border-color:#43a047}
.tokens{font-family:ui-monospace,monospace;font-size:12.5px;white-space:pre-wrap;line-height:1.9}
.tok{border-radius:2px;padding:1px 0}.tok.obs{background:#e0e0e0;color:#555}
.legend span{display:inline-block;padding:0 6px;margin-right:6px;border-radius:2px}
.diverged{background:#fff3e0}.cols{display:flex;gap:10px;align-items:flex-start}.cols>div{flex:1;min-width:0}
table.diff{font-family:ui-monospace,monospace;font-size:12px}.diff_add{background:#c8e6c9}.diff_sub{background:#ffcdd2}
.diff_chg{background:#fff59d}
"""


def layout(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)} - forge-bridge inspect"
            f"</title><style>{_STYLE}</style></head><body><nav><a href='/'>Runs</a><a href='/trajectories'>"
            f"Trajectories</a><a href='/compare'>Compare versions</a></nav><main><h1>{html.escape(title)}</h1>"
            f"{body}</main></body></html>")


def link(path: str, item: str = "", **query: Any) -> str:
    """An href: `path` + the URL-quoted `item` (an id may hold '#', '?', '/') + the query."""
    q = urllib.parse.urlencode({k: v for k, v in query.items() if v not in ("", None)})
    return html.escape(path + urllib.parse.quote(item, safe="") + (f"?{q}" if q else ""), quote=True)


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if math.isfinite(x) else str(x)
    return html.escape(str(x))


# ---------------------------------------------------------------------- runs and curves
def index(view: RunView) -> str:
    rows = "".join(f"<tr><td><a href='{link('/trajectories', run=r)}'>{html.escape(str(r))}</a></td><td>{n}</td>"
                   f"<td>{done}</td><td>{fmt(mean)}</td></tr>" for r, n, done, mean in view.store.runs())
    body = [f"<p class='muted'>{html.escape(str(view.folder or view.store_path))}</p>",
            f"<h2>Runs in the store</h2><table><tr><th>run</th><th>trajectories</th><th>complete</th>"
            f"<th>mean reward</th></tr>{rows}</table>"]
    metrics = view.metrics()
    events = [e for e in view.store.events() if e["kind"] != "judge_failed"]  # those: on their trajectories' pages
    marks = [(float(m.group(1)), f"{e['kind']} {e['version']}") for e in events
             if (m := re.search(r"-v(\d+)$", e["version"] or ""))]
    charts = [line_chart(title, {key: [(m["iteration"], float(m[key])) for m in metrics
                                       if isinstance(m.get(key), (int, float))] for key in keys}, marks=marks)
              for title, keys in CURVES]
    formats = sorted({k for m in metrics for k in m if k.startswith("calls/")})
    if formats:
        charts.append(line_chart("tool calls read, by format (share of calling steps)",
                                 {k.split("/", 1)[1]: [(m["iteration"], float(m.get(k, 0.0))) for m in metrics]
                                  for k in formats}, y_range=(0, 1)))
    run_id = view.training_run_id()
    if run_id:
        by_kind = view.store.success_by_kind(run_id)
        charts.append(line_chart("success rate by task kind (training rollouts)",
                                 {k: sorted(v.items()) for k, v in by_kind.items()}, y_range=(0, 1)))
    body.append(f"<h2>Training curves</h2><div class='charts' id='curves'>{''.join(charts)}</div>")
    if events:
        rows = "".join(f"<tr><td>{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(e['at']))}</td><td>{html.escape(e['kind'])}"
                       f"</td><td>{html.escape(str(e['version']))}</td><td>{html.escape(json.dumps(e['detail']))}</td></tr>"
                       for e in events)
        body.append("<h2>Serving events</h2><p class='muted'>dashed lines on the curves</p><table id='events'>"
                    f"<tr><th>at (UTC)</th><th>event</th><th>version</th><th>scores</th></tr>{rows}</table>")
    evaluations = view.evaluations()
    if evaluations:
        kinds = list(dict.fromkeys(k for phase in evaluations.values() for k in phase))
        head = "".join(f"<th>{html.escape(k)}</th>" for k in kinds)
        rows = "".join(f"<tr><th>{html.escape(phase)}</th>" + "".join(
            f"<td>{fmt(values.get(k))}</td>" for k in kinds) + "</tr>" for phase, values in evaluations.items())
        body.append(f"<h2>Held-out evaluations</h2><table id='evaluations'><tr><th></th>{head}</tr>{rows}</table>")
    return layout("Runs and curves", "".join(body))


# ---------------------------------------------------------------------- the table
def trajectories(view: RunView, f: Filters) -> str:
    items, total = view.list_trajectories(f, PER_PAGE)
    q = f.query

    def select(name: str, options: list[str], current: str) -> str:
        opts = "".join(f"<option value='{html.escape(o)}'{' selected' if o == current else ''}>{html.escape(o) or 'any'}"
                       "</option>" for o in ["", *options])
        return f"<label>{name} <select name='{name}'>{opts}</select></label> "

    form = ("<form method='get' action='/trajectories' id='filters'>" + select("run", [str(r[0]) for r in view.store.runs()], q.run)
            + select("kind", view.store.kinds(), q.kind) + select("outcome", ["success", "failure"], q.outcome)
            + select("status", list(STATUSES), q.status) + select("behaviour", list(BEHAVIOURS), q.behaviour)
            + f"<label>iteration <input name='iteration' size='4' value='{html.escape(q.iteration)}'></label> "
            f"<label>task <input name='task' size='14' value='{html.escape(q.task)}'></label> "
            f"<input type='hidden' name='sort' value='{q.sort}'><input type='hidden' name='order' value='{q.order}'>"
            "<button type='submit'>Filter</button></form>")
    base = {k: getattr(q, k) for k in ("run", "kind", "outcome", "status", "iteration", "task", "group", "behaviour")}

    def header(label: str, key: str | None) -> str:
        if key is None:
            return f"<th>{label}</th>"
        order = "asc" if q.sort == key and q.order == "desc" else "desc"
        mark = (" ▼" if q.order == "desc" else " ▲") if q.sort == key else ""
        return f"<th><a href='{link('/trajectories', **base, sort=key, order=order)}'>{label}{mark}</a></th>"

    heads = "".join(header(label, key) for label, key in (
        ("run", None), ("iteration", "iteration"), ("task", "task"), ("kind", None), ("group", None),
        ("status", "status"), ("end", None), ("reward", "reward"), ("steps", None), ("version", None), ("by", None)))
    rows = []
    for row in items:
        t = row.trajectory
        cls = "bad" if t.status != "complete" or (t.reward or 0) < 1 else ""
        group = (f"<a href='{link('/group/', t.group_id)}'>{html.escape(t.group_id[-24:])}</a>" if t.group_id else "–")
        rows.append(f"<tr class='{cls}' data-id='{esc(t.id)}'><td>{html.escape(str(t.run_id))}</td><td>{fmt(row.iteration)}"
                    f"</td><td><a href='{link('/trajectory/', t.id)}'>{html.escape(str(t.task_id))}</a></td>"
                    f"<td>{fmt(row.kind)}</td><td>{group}</td><td>{fmt(t.status)}</td><td>{fmt(t.end_reason)}"
                    f"{' (excluded)' if t.excluded else ''}</td><td>{fmt(t.reward)}</td><td>{row.steps}</td>"
                    f"<td>{fmt(row.version)}</td><td class='by'>{'' if t.behaviour == 'policy' else t.behaviour}</td></tr>")
    pages = max(1, -(-total // PER_PAGE))
    nav = []
    if f.page > 1:
        nav.append(f"<a href='{link('/trajectories', **base, sort=q.sort, order=q.order, page=f.page - 1)}'>« previous</a>")
    if f.page < pages:
        nav.append(f"<a href='{link('/trajectories', **base, sort=q.sort, order=q.order, page=f.page + 1)}'>next »</a>")
    body = (f"{form}<p id='total'>{total} trajectories; page {f.page} of {pages}</p>"
            f"<table id='trajectories'><tr>{heads}</tr>{''.join(rows)}</table><p>{' '.join(nav)}</p>")
    return layout("Trajectories", body)


# ---------------------------------------------------------------------- one trajectory
def _message(m: dict) -> str:
    role = m.get("role", "?")
    text = m.get("content") or ""
    if not isinstance(text, str):
        text = json.dumps(text, ensure_ascii=False)
    calls = "".join(f"\n→ {c.get('function', {}).get('name')}({c.get('function', {}).get('arguments')})"
                    for c in m.get("tool_calls") or [])
    return f"<div class='msg {html.escape(role)}'><b>{html.escape(role)}</b>: {html.escape(text + calls)}</div>"


def _reply(action: Action) -> str:
    read = (f"<p class='muted call-format'>calls read from: {html.escape(action.call_format)}</p>"
            if action.call_format else "")
    return _message({"role": "assistant", "content": action.content,
                     "tool_calls": [c.to_openai() for c in action.tool_calls]}) + read


def _background(colouring: str, logprob: float | None, trained: bool, advantage: float | None, scale: float,
                teacher: float | None = None) -> str:
    if colouring == "teacher":  # log pi_teacher - log pi_student: green where the teacher likes it more
        if teacher is None or logprob is None:
            return "#e0e0e0"
        a = max(-1.0, min(1.0, (teacher - logprob) / 2))
        return f"rgba(46,125,50,{abs(a):.2f})" if a >= 0 else f"rgba(198,40,40,{abs(a):.2f})"
    if colouring == "trained":
        return "#bbdefb" if trained else "#e0e0e0"
    if colouring == "advantage":
        if not trained or advantage is None:
            return "#e0e0e0"
        a = max(-1.0, min(1.0, advantage / scale))
        return f"rgba(46,125,50,{abs(a):.2f})" if a >= 0 else f"rgba(198,40,40,{abs(a):.2f})"
    p = math.exp(logprob) if logprob is not None else 1.0  # logprob: red unlikely -> green likely
    return f"hsl({120 * p:.0f},70%,82%)"


def token_view(view: RunView, step: Step, colouring: str, scale: float) -> str:
    completion = step.transition.completion_token_ids
    logprobs = step.transition.completion_logprobs
    spans = []
    for text in view.token_texts(step.new_prompt_ids):
        spans.append(f"<span class='tok obs' data-trained='0' title='prompt / observation token: not trained'>"
                     f"{html.escape(text)}</span>")
    for i, (token, text) in enumerate(zip(completion, view.token_texts(completion))):
        trained = i < step.trained_tokens
        lp = logprobs[i] if i < len(logprobs) else None
        teacher = step.teacher_logprobs[i] if step.teacher_logprobs and i < len(step.teacher_logprobs) else None
        title = (f"id {token}, logprob {fmt(lp, 4)}, {'trained' if trained else 'not trained'}, "
                 f"advantage {fmt(step.advantage, 4)}" + (f", teacher logprob {fmt(teacher, 4)}" if teacher is not None else ""))
        spans.append(f"<span class='tok' data-trained='{int(trained)}' data-logprob='{lp}' data-teacher='{fmt(teacher, 4)}' "
                     f"style='background:{_background(colouring, lp, trained, step.advantage, scale, teacher)}' "
                     f"title='{html.escape(title)}'>{html.escape(text)}</span>")
    return f"<div class='tokens'>{''.join(spans)}</div>"


def trajectory(view: RunView, trajectory_id: str, colouring: str = "logprob") -> str:
    info, steps = view.trajectory(trajectory_id)
    colouring = colouring if colouring in COLOURINGS else "logprob"
    scale = max([abs(s.advantage) for s in steps if s.advantage is not None] or [1.0]) or 1.0
    modes = " ".join(f"<a href='{link('/trajectory/', trajectory_id, colour=c)}'>{'<b>' + c + '</b>' if c == colouring else c}</a>"
                     for c in COLOURINGS)
    legend = {"logprob": "<span style='background:hsl(0,70%,82%)'>unlikely</span><span style='background:hsl(120,70%,82%)'>"
                         "likely</span>",
              "trained": "<span style='background:#bbdefb'>trained</span><span style='background:#e0e0e0'>not trained</span>",
              "advantage": "<span style='background:rgba(46,125,50,.8)'>positive</span><span style='background:"
                           "rgba(198,40,40,.8)'>negative</span><span style='background:#e0e0e0'>not trained</span>",
              "teacher": "<span style='background:rgba(46,125,50,.8)'>the teacher likes it more</span><span style="
                         "'background:rgba(198,40,40,.8)'>less</span><span style='background:#e0e0e0'>not scored</span>"}
    group = (f"<a href='{link('/group/', info.group_id)}'>{html.escape(info.group_id)}</a>" if info.group_id else "–")
    head = (f"<table><tr><th>task</th><td>{html.escape(str(info.task_id))}</td><th>run</th><td>{html.escape(str(info.run_id))}"
            f"</td></tr><tr><th>status</th><td>{fmt(info.status)} ({fmt(info.end_reason)}{': ' + html.escape(info.end_detail) if info.end_detail else ''})"
            f"</td><th>reward</th><td id='reward'>{fmt(info.reward)}</td></tr><tr><th>group</th><td>{group}</td>"
            f"<th>metadata</th><td>{html.escape(json.dumps(info.metadata))}</td></tr>"
            f"<tr><th>behaviour</th><td id='behaviour' colspan=3>{info.behaviour}"
            f"{' (not sampled by the policy: its tokens are trained with the shaped weight)' if info.behaviour == 'guide' else ''}</td></tr>"
            f"{'<tr><th>excluded</th><td colspan=3>' + html.escape(info.excluded) + '</td></tr>' if info.excluded else ''}"
            f"</table><p>colour tokens by: {modes} <span class='legend'>{legend[colouring]}</span></p>")
    sections, seen = [], 0
    for step in steps:
        t = step.transition
        messages = t.observation.messages
        new = messages[seen:] if seen <= len(messages) else messages
        seen = len(messages)
        results = t.info.get("tool_results") or {}
        result_rows = "".join(
            f"<tr><td>{html.escape(str(r.get('name')))}</td><td class='{'good' if r.get('status') == 'success' else 'bad'}'>"
            f"{fmt(r.get('status'))}</td><td>{fmt(r.get('latency_s'))} s</td><td>{html.escape(str(r.get('error') or ''))}"
            f"</td><td>{html.escape(str(r.get('content'))[:500])}</td></tr>" for r in results.values())
        tools = json.dumps(t.observation.tools or [], indent=1, ensure_ascii=False)
        credit = (f"iteration {step.iteration}, advantage <b class='advantage'>{fmt(step.advantage, 4)}</b>, "
                  f"{step.trained_tokens} of {len(t.completion_token_ids)} completion tokens trained"
                  if step.iteration is not None else "not used by a trainer (no credit recorded)")
        sections.append(
            f"<section class='step' id='step-{step.index}' data-step='{step.index}' "
            f"data-advantage='{step.advantage if step.advantage is not None else ''}' "
            f"data-trained-tokens='{step.trained_tokens}'><h2>step {step.index} · version {fmt(t.version)}"
            f" · reward {fmt(t.reward)}{' · terminated' if t.terminated else ''}"
            f"{' · truncated' if t.truncated else ''}</h2><p>{credit}</p>"
            f"<details><summary>what the model saw: {len(messages)} messages, {len(t.observation.tools or [])} tools "
            f"({len(new)} new)</summary>{''.join(_message(m) for m in messages)}<pre>{html.escape(tools)}</pre></details>"
            f"{''.join(_message(m) for m in new)}"
            f"<h3>reply</h3>{_reply(t.action)}"
            + (f"<table class='results'><tr><th>tool</th><th>status</th><th>latency</th><th>error</th><th>result</th></tr>"
               f"{result_rows}</table>" if result_rows else "")
            + f"<h3>tokens</h3>{token_view(view, step, colouring, scale)}</section>")
    return layout(f"Trajectory {trajectory_id}", head + feedback_table(view, trajectory_id) + "".join(sections))


def feedback_table(view: RunView, trajectory_id: str) -> str:
    """The feedback on the episode, in arrival order: users', reviewers', judges' (with their reasons)."""
    events = view.store.feedback([trajectory_id]).get(trajectory_id, [])
    failed = view.store.events("judge_failed", episode=trajectory_id)
    if not events and not failed:
        return ""
    rows = "".join(f"<tr><td>{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(e.at))}</td><td>{html.escape(e.key)}</td>"
                   f"<td class='value'>{fmt(e.value)}</td><td>{html.escape(e.source or '')}</td>"
                   f"<td>{'' if e.step is None else e.step}</td><td>{html.escape(e.comment or '')}</td></tr>" for e in events)
    rows += "".join(f"<tr class='failed'><td>{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(e['at']))}</td>"
                    f"<td>{html.escape(str(e['detail'].get('key')))}</td><td class='value'>no verdict</td>"
                    f"<td>judge:{html.escape(str(e['detail'].get('judge')))}</td><td></td>"
                    f"<td>{html.escape(str(e['detail'].get('error')))}</td></tr>" for e in failed)
    return (f"<h2>feedback ({len(events)}{f', {len(failed)} judge failures' if failed else ''})</h2><table id='feedback'>"
            f"<tr><th>at (UTC)</th><th>key</th><th>value</th><th>source</th><th>step</th><th>comment</th></tr>{rows}</table>")


# ---------------------------------------------------------------------- a group
def group(view: RunView, group_id: str) -> str:
    rollouts = view.group(group_id)
    split = first_divergence([steps for _, steps in rollouts])
    columns = []
    for info, steps in rollouts:
        cells = []
        for step in steps:
            action = step.transition.action
            calls = "; ".join(f"{c.name}({c.arguments})" for c in action.tool_calls)
            cls = "step diverged" if step.index == split else "step"
            cells.append(f"<div class='{cls}' data-step='{step.index}'><b>step {step.index}</b> · advantage "
                         f"<span class='advantage'>{fmt(step.advantage, 4)}</span> · reward {fmt(step.transition.reward)}"
                         f"<div class='msg assistant'>{html.escape(action.content + (' ' + calls if calls else ''))}"
                         "</div></div>")
        by = "" if info.behaviour == "policy" else f" · <b class='by'>{info.behaviour}</b>"
        columns.append(f"<div class='rollout' data-id='{esc(info.id)}' data-behaviour='{info.behaviour}'><h2><a href='"
                       f"{link('/trajectory/', info.id)}'>{esc(info.id[:10])}</a> · return {fmt(info.reward)} · "
                       f"{fmt(info.status)}{by}</h2>{''.join(cells)}</div>")
    note = (f"<p id='divergence'>The rollouts first differ at step {split} (highlighted).</p>" if split is not None
            else "<p id='divergence'>The rollouts acted identically throughout.</p>")
    return layout(f"Group {group_id}", note + f"<div class='cols'>{''.join(columns)}</div>")


# ---------------------------------------------------------------------- two versions
def _transcript(view: RunView, trajectory_id: str) -> list[str]:
    _, steps = view.trajectory(trajectory_id)
    lines = []
    for step in steps:
        action = step.transition.action
        for c in action.tool_calls:
            lines.append(f"step {step.index}: call {c.name}({c.arguments})")
        for r in (step.transition.info.get("tool_results") or {}).values():
            lines.append(f"step {step.index}: result {str(r.get('content'))[:200]}")
        if action.content:
            lines.append(f"step {step.index}: says {action.content}")
    return lines


def compare(view: RunView, task: str = "", a: str = "", b: str = "") -> str:
    tasks = view.store.evaluated_tasks()
    options = "".join(f"<option{' selected' if t == task else ''}>{html.escape(t)}</option>" for t in tasks)
    form = (f"<form method='get' action='/compare'><label>held-out task <select name='task'>{options}</select></label> "
            "<button type='submit'>Show</button></form>")
    if not task:
        return layout("Compare adapter versions", form + "<p>Pick a task answered in more than one evaluation.</p>")
    answers = view.store.attempts(task)
    rows = "".join(f"<tr><td>{fmt(run)}</td><td>{fmt(version)}</td><td>{fmt(reward)}</td><td>"
                   f"<a href='{link('/trajectory/', tid)}'>{esc(tid[:10])}</a></td></tr>" for tid, run, version, reward in answers)
    ids = [t[0] for t in answers]
    a = a if a in ids else (ids[0] if ids else "")
    b = b if b in ids else (ids[-1] if ids else "")
    # HtmlDiff writes its labels as they are: escape them here
    label = {tid: esc(f"{run} ({version or 'base model'}): reward {fmt(reward)}") for tid, run, version, reward in answers}
    diff = ""
    if a and b:
        diff = difflib.HtmlDiff(wrapcolumn=70).make_table(_transcript(view, a), _transcript(view, b),
                                                          label[a], label[b])
    body = (f"{form}<h2>Every recorded answer to {html.escape(task)}</h2><table><tr><th>run</th><th>version</th>"
            f"<th>reward</th><th>trajectory</th></tr>{rows}</table><h2>Diff</h2><div id='diff'>{diff}</div>")
    return layout("Compare adapter versions", body)


__all__ = ["compare", "group", "index", "trajectories", "trajectory"]
