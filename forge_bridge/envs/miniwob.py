"""MiniWoB++ as an environment: the 125 web tasks of Farama's `miniwob` package (its task pages,
each with its own reward, offline), in the project's own browser stack.

Why Playwright and not the package's Selenium: `BrowserEnvironment` already drives the system's
Chromium with Playwright, on a thread of its own, with a fresh context per episode and every
request off 127.0.0.1 refused. `MiniWoBEnvironment` is that environment, serving the package's
`html/` folder on 127.0.0.1 (`MiniWoBSite`, a `LocalSite`) and driving MiniWoB's own JavaScript
API the way its `selenium_instance.py` does: `Math.seedrandom(seed)`, `core.startEpisodeReal()`,
then `WOB_DONE_GLOBAL` / `WOB_RAW_REWARD_GLOBAL` / `WOB_REWARD_REASON` after each action. So one
browser stack is installed, launched and secured, not two (Selenium would also need Debian's
`chromium-driver`, matched to the Chromium version); the package's Python code is never imported
(its Gymnasium environments, its Selenium), only its pages are served.

The observation is the task's instruction (`#query`) and the page as text, one line per visible
element from MiniWoB's own `core.getDOMInfo()`: `[ref] tag#id "text"` with values, checked
states and a select's options. An element keeps its ref for the whole episode (MiniWoB stamps it
on the element), so a ref read three steps ago still names the same element. The actions are tool
calls: `click(ref)`, `type(ref, text)` (replaces the field's text, typed as keystrokes),
`press(key)` (Playwright's key names: Enter, Tab, Control+a) and `select(ref, option)`. A call
that cannot be done (an unknown ref, a wrong type, a key that does not exist) is an error the model
observes; the episode goes on.

MiniWoB's episode clock (10 s by default, set by each page) is STOPPED by default
(`MiniWoBConfig.episode_time_s=None`): a slow model on a CPU is not failed by its own thinking
time, and an episode ends when the task ends it or when the agent's step limit cuts it
(truncated). Set `episode_time_s` to stretch the clock instead; when it runs out, the episode is
truncated (Gymnasium's `truncated`, not `terminated`) with reward 0.

The reward is MiniWoB's raw reward (without its time penalty: the clock is this environment's
business), with MiniWoB's -1 for a wrong end counted as 0, this project's failure; the raw value
and MiniWoB's reason are in the step's `info['miniwob']`. An answer with no tool call ends the
episode, scored by what the page says (0 while the task is not done).
"""

from __future__ import annotations

import difflib
import functools
import threading
from dataclasses import dataclass, field
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

from forge_bridge.core.errors import InvalidArgument, InvalidState, NotFound, WrongType
from forge_bridge.core.extras import locate
from forge_bridge.core.types import Action
from forge_bridge.envs.base import StepResult
from forge_bridge.envs.browser import BrowserEnvironment, BrowserUnavailable
from forge_bridge.envs.miniwob_dom import PAGE_JS, START_JS, dom_text
from forge_bridge.envs.tool import ToolError, ToolEnvironment, ToolTask, function_schema

_NOT_TYPED_INTO = ("checkbox", "radio", "button", "submit", "reset", "image", "file", "range", "color")


@functools.cache
def html_folder() -> Path:
    """The installed `miniwob` package's `html/` folder (the package is not imported)."""
    return locate("miniwob", "miniwob") / "html"


UNREGISTERED = ("button-delay", "chase-circle", "hover-shape", "moving-items", "simon-says")
"""Pages miniwob 1.1.0 ships but does not register as environments (left out here too); its
FlightWoB tasks (`html/flight/`) are not served either."""


@functools.cache
def task_names() -> tuple[str, ...]:
    """The MiniWoB++ task names this install has (its `html/miniwob/*.html`: 125 in 1.1.0), sorted."""
    pages = (p.stem for p in (html_folder() / "miniwob").glob("*.html"))
    return tuple(sorted(name for name in pages if name not in UNREGISTERED))


def check_task_name(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise WrongType(f"MiniWoB task name: expected a non-empty string, got {name!r}")
    if name not in task_names():
        near = difflib.get_close_matches(name, task_names(), n=5, cutoff=0.5)
        hint = f"did you mean {', '.join(near)}?" if near else f"the tasks are {', '.join(task_names()[:8])}, ..."
        raise NotFound(f"MiniWoB++ has no task {name!r} ({len(task_names())} tasks; {hint})")
    return name


@dataclass(frozen=True)
class MiniWoBTask:
    """One MiniWoB++ episode to run: a task page and the seed its problem is drawn with."""

    name: str
    """The task's name, as MiniWoB spells it ('click-button', 'login-user')."""
    seed: int = 0
    """`Math.seedrandom(seed)` before the problem is drawn: the same seed, the same problem."""
    id: str = field(init=False)
    """'<name>-<seed>': rollouts of the same problem share it."""
    kind: str = field(init=False)
    """The task's name: per-kind metrics count success per MiniWoB task."""

    def __post_init__(self) -> None:
        check_task_name(self.name)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise InvalidArgument(f"MiniWoBTask.seed: expected an int >= 0, got {self.seed!r}")
        object.__setattr__(self, "id", f"{self.name}-{self.seed}")
        object.__setattr__(self, "kind", self.name)


@dataclass(frozen=True)
class MiniWoBConfig:
    """How the MiniWoB++ environment runs its episodes."""

    episode_time_s: float | None = None
    """MiniWoB's own episode clock: None stops it (the default); a number stretches it to that many seconds."""
    action_timeout_s: float = 5.0
    """How long one browser action (or the page's load) may take before it is an error."""
    max_observation_chars: int = 4000
    """Longer page text is cut, saying how much was left out."""
    mode: str = "train"
    """MiniWoB's data mode ('train' or 'test'): the few tasks with a held-out split draw from it."""
    executable_path: str | None = None
    """The Chromium to run (default: the system's, found on PATH)."""

    def __post_init__(self) -> None:
        for name in ("episode_time_s", "action_timeout_s"):
            value = getattr(self, name)
            if value is None and name == "episode_time_s":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 86_400:
                raise InvalidArgument(f"MiniWoBConfig.{name}: expected seconds > 0 (less than a day), got {value!r}")
        if isinstance(self.max_observation_chars, bool) or not isinstance(self.max_observation_chars, int) \
                or self.max_observation_chars < 100:
            raise InvalidArgument(f"MiniWoBConfig.max_observation_chars: expected an int >= 100, "
                                  f"got {self.max_observation_chars!r}")
        if self.mode not in ("train", "test"):
            raise InvalidArgument(f"MiniWoBConfig.mode: expected 'train' or 'test', got {self.mode!r}")


class _QuietFiles(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class MiniWoBSite:
    """The package's `html/` folder, served read-only on 127.0.0.1 (a `LocalSite`): the task
    pages load their scripts from `../core/` and `../common/`, which `file:` URLs would not give
    a browser that refuses them."""

    def __init__(self, folder: Path | None = None, host: str = "127.0.0.1") -> None:
        self.folder, self.host = folder or html_folder(), host
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> str:
        if self._server is None:
            self._server = ThreadingHTTPServer((self.host, 0), partial(_QuietFiles, directory=str(self.folder)))
            self._server.daemon_threads = True
            threading.Thread(target=self._server.serve_forever, daemon=True, name="miniwob-site").start()
        return self.url

    @property
    def url(self) -> str:
        if self._server is None:
            raise InvalidState("the MiniWoB site is not running")
        return f"http://{self.host}:{self._server.server_address[1]}"

    def reset(self) -> None:
        """Nothing to reset: a task's state lives in its page, loaded fresh each episode."""

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class MiniWoBPageError(BrowserUnavailable):
    """A task's page did not load or start an episode; the episode it was for is recorded as
    crashed (never trained on), with this message."""


class MiniWoBEnvironment(BrowserEnvironment):
    """MiniWoB++ tasks (`MiniWoBTask`, or a task name for seed 0) in headless Chromium."""

    def __init__(self, config: MiniWoBConfig | None = None) -> None:
        self.config = config if config is not None else MiniWoBConfig()
        if not isinstance(self.config, MiniWoBConfig):
            raise WrongType(f"config: expected a MiniWoBConfig, got {type(self.config).__name__}")
        self.miniwob_task: MiniWoBTask | None = None
        self.outcome: dict | None = None
        """How the page ended the episode ({'raw_reward', 'reason'}), None while it runs."""
        self._episode = ""
        super().__init__(MiniWoBSite(), executable_path=self.config.executable_path,
                         action_timeout_s=self.config.action_timeout_s,
                         max_observation_chars=self.config.max_observation_chars)

    @property
    def reward(self) -> float:
        """The episode's reward so far: MiniWoB's raw reward once it ended, a failure (-1) as 0."""
        return max(0.0, float(self.outcome["raw_reward"])) if self.outcome else 0.0

    def tool_functions(self) -> dict[str, tuple[dict, Callable[..., Any]]]:
        ref = {"type": "integer", "description": "an element's ref, the N of [N] on the page"}
        return {
            "click": (function_schema("click", "Click an element; returns the page after it.",
                                      {"ref": ref}, ("ref",)), self.click),
            "type": (function_schema("type", "Replace the text of a field with `text`, typed as keystrokes.",
                                     {"ref": ref, "text": {"type": "string"}}, ("ref", "text")), self.type),
            "press": (function_schema("press", "Press a key on the focused element: Enter, Tab, Backspace, "
                                      "ArrowDown, Control+a, ...", {"key": {"type": "string"}}, ("key",)), self.press),
            "select": (function_schema("select", "Choose an option of a select element by its text.",
                                       {"ref": ref, "option": {"type": "string"}}, ("ref", "option")), self.select),
        }

    # ------------------------------------------------------------------ episode
    def reset(self, task: Any) -> list[dict]:
        if isinstance(task, str):
            task = MiniWoBTask(task)
        if not isinstance(task, MiniWoBTask):
            raise WrongType(f"task: expected a MiniWoBTask or a task name, got {type(task).__name__}")
        self.miniwob_task, self.outcome = task, None
        ToolEnvironment.reset(self, ToolTask(task.id, "", check=lambda answer, env: self.reward))
        url = f"{self.start_url}/miniwob/{task.name}.html"
        try:
            page = self._act(lambda: self._start(url, task))
        except ToolError as exc:
            self.done = True  # nothing to step on
            raise MiniWoBPageError(f"the page of MiniWoB task {task.name!r} ({url}) did not load: {exc}") from None
        return [{"role": "user", "content": page}]

    def _start(self, url: str, task: MiniWoBTask) -> None:
        """On the browser thread: load the page, seed it, start MiniWoB's episode, set its clock."""
        timeout_ms = self.action_timeout_s * 1000
        response = self._page.goto(url)
        if response is None or not response.ok:
            raise ToolError(f"HTTP {response.status if response else 'no response'}")
        self._page.wait_for_function("() => window.core && core.cover_div && typeof genProblem === 'function'",
                                     timeout=timeout_ms)
        clock = self.config.episode_time_s
        self._episode = self._page.evaluate(START_JS, {"seed": task.seed, "mode": self.config.mode,
                                                       "ms": None if clock is None else clock * 1000})
        self._page.wait_for_function("() => WOB_TASK_READY", timeout=timeout_ms)

    def step(self, action: Action) -> StepResult:
        if self.task is not None and not self.done and self.outcome is None:
            self._call(self._read_outcome)  # the clock may have run out while the model thought
            if self.outcome is not None:
                return self._ended(None, {})
        result = super().step(action)
        if result.done:  # an answer with no tool call: the episode ends, scored by the page
            return StepResult(observation=None, reward=result.reward, terminated=True,
                              info={**result.info, **self._info()})
        if self.outcome is not None:
            return self._ended(result.observation, result.info)
        return result

    def _ended(self, observation: Any, info: dict) -> StepResult:
        self.done = True
        timed_out = bool(self.outcome and self.outcome.get("reason") == "timed out")
        return StepResult(observation=observation, reward=self.reward, terminated=not timed_out,
                          truncated=timed_out, info={**info, **self._info(),
                                                     **({"reason": "MiniWoB's episode clock ran out"}
                                                        if timed_out else {})})

    def _info(self) -> dict:
        assert self.miniwob_task is not None  # only asked during an episode
        return {"miniwob": {"task": self.miniwob_task.name, "seed": self.miniwob_task.seed,
                            "done": self.outcome is not None, **(self.outcome or {})}}

    def _read_outcome(self) -> None:
        state = self._page.evaluate("() => [WOB_DONE_GLOBAL, WOB_RAW_REWARD_GLOBAL, WOB_REWARD_REASON]")
        if state[0] and self.outcome is None:
            self.outcome = {"raw_reward": float(state[1]), "reason": state[2]}

    def _describe(self) -> str:
        """The page as the model reads it (on the browser thread, after every action)."""
        self._read_outcome()
        if self.outcome is not None:
            reason = self.outcome["reason"] or ("success" if self.outcome["raw_reward"] > 0 else "failure")
            return (f"The task is over ({reason}): reward {self.reward:g}. Answer without a tool call to finish.")
        state = self._page.evaluate(PAGE_JS)
        return dom_text(state["utterance"], state["tree"], self.max_observation_chars)

    # ------------------------------------------------------------------ tools
    def _check_running(self) -> None:
        if self.outcome is not None:
            raise ToolError(f"the task is over (reward {self.reward:g}); answer without a tool call to finish")

    def _element(self, ref: Any) -> Any:
        """The element with this ref in this episode (a Playwright locator), or a ToolError."""
        self._check_running()
        text = str(ref).strip().strip("[]")
        if isinstance(ref, bool) or not text.lstrip("-").isdigit():
            raise ToolError(f"ref: expected an element's number from the page, like 4, got {ref!r}")
        locator = self._page.locator(f'[data-wob_ref="{int(text)}"][data-wob_eps="{self._episode}"]')
        if not locator.count():
            raise ToolError(f"no element [{text}] on this page (use a ref the page lists as [N])")
        return locator.first

    def click(self, ref: Any) -> str:  # a ref where the web browser takes a target
        def run() -> None:
            result = self._element(ref).evaluate(
                "el => { core.previousDOMInfo[+el.dataset.wob_ref] = el; return core.elementClick(+el.dataset.wob_ref); }")
            if result is not True:
                raise ToolError(f"click on [{ref}] failed: {result}")

        return self._act(run)

    def type(self, ref: Any, text: str) -> str:
        def run() -> None:
            element = self._element(ref)
            kind = element.evaluate("el => el.isContentEditable ? 'editable' : el.tagName === 'INPUT' ? "
                                    "'input ' + el.type : el.tagName.toLowerCase()")
            if kind not in ("editable", "textarea") and not (
                    kind.startswith("input ") and kind[6:] not in _NOT_TYPED_INTO):
                raise ToolError(f"[{ref}] is a {kind}, not a text field")
            element.evaluate("el => { core.previousDOMInfo[+el.dataset.wob_ref] = el; "
                             "core.elementClick(+el.dataset.wob_ref); if (el.select) el.select(); }")
            if text:
                self._page.keyboard.type(text)
            else:
                self._page.keyboard.press("Delete")

        return self._act(run)

    def press(self, key: str) -> str:
        def run() -> None:
            self._check_running()
            self._page.keyboard.press(key)

        return self._act(run)

    def select(self, ref: Any, option: str) -> str:
        def run() -> None:
            element = self._element(ref)
            options = element.evaluate("el => el.tagName === 'SELECT' ? [...el.options].map(o => o.text.trim()) : null")
            if options is None:
                raise ToolError(f"[{ref}] is not a select element")
            if option.strip() not in options:
                raise ToolError(f"[{ref}] has no option {option!r} (options: {', '.join(options)})")
            element.select_option(index=options.index(option.strip()))

        return self._act(run)


__all__ = ["MiniWoBConfig", "MiniWoBEnvironment", "MiniWoBPageError", "MiniWoBSite", "MiniWoBTask",
           "UNREGISTERED", "html_folder", "task_names"]
