"""OSWorld's two action spaces, read on the host into checked action records; never executed here.

- `pyautogui`: the reply holds Python code in fenced blocks, as OSWorld's agents write it
  (`pyautogui.click(120, 340)`, `pyautogui.typewrite('hello')`, `pyautogui.hotkey('ctrl', 's')`,
  `time.sleep(1)`). The code is parsed with `ast`, never run: each statement must be one call of an
  allow-listed function (ALLOWED below) with literal arguments, or an import of pyautogui / time. A
  loop, an assignment, a variable, an attribute of anything else is refused by name. A block that is
  only `WAIT`, `DONE` or `FAIL` is that special action.
- `computer_13`: the reply holds a JSON object (or a list of them) with `action_type` one of OSWorld's
  13 kinds plus WAIT / DONE / FAIL, and its parameters.

Both give the same records (`kind`: move, move_rel, click, mouse_down, mouse_up, drag, scroll, type,
keys, hotkey, key_down, key_up, sleep), with coordinates inside the screen and key names turned into X
keysyms; the desktop's controller turns each into xdotool arguments.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field

from dockyard.errors import DockyardError

SPECIALS = ("WAIT", "DONE", "FAIL")
MAX_ACTIONS = 50          # per reply
MAX_TEXT = 4000           # characters typed by one action
MAX_SLEEP_S = 10.0        # one sleep; OSWorld's agents wait between steps, not for minutes
# a language word only where a newline follows it: ```DONE``` is the block "DONE", not a language
_BLOCK = re.compile(r"```(?:[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n)?(.*?)```", re.DOTALL)

NAMED_KEYS = {
    "enter": "Return", "return": "Return", "\n": "Return", "tab": "Tab", "\t": "Tab", "space": "space",
    "backspace": "BackSpace", "delete": "Delete", "del": "Delete", "esc": "Escape", "escape": "Escape",
    "up": "Up", "down": "Down", "left": "Left", "right": "Right", "home": "Home", "end": "End",
    "pageup": "Prior", "pgup": "Prior", "pagedown": "Next", "pgdn": "Next", "insert": "Insert",
    "ctrl": "ctrl", "ctrlleft": "Control_L", "ctrlright": "Control_R", "control": "ctrl",
    "shift": "shift", "shiftleft": "Shift_L", "shiftright": "Shift_R",
    "alt": "alt", "altleft": "Alt_L", "altright": "Alt_R", "option": "alt",
    "win": "super", "winleft": "Super_L", "winright": "Super_R", "command": "super", "super": "super",
    "capslock": "Caps_Lock", "numlock": "Num_Lock", "scrolllock": "Scroll_Lock", "printscreen": "Print",
    "prtsc": "Print", "prntscrn": "Print", "menu": "Menu", "apps": "Menu", "pause": "Pause",
    **{f"f{n}": f"F{n}" for n in range(1, 25)},
}
PUNCTUATION = {
    " ": "space", "!": "exclam", '"': "quotedbl", "#": "numbersign", "$": "dollar", "%": "percent",
    "&": "ampersand", "'": "apostrophe", "(": "parenleft", ")": "parenright", "*": "asterisk", "+": "plus",
    ",": "comma", "-": "minus", ".": "period", "/": "slash", ":": "colon", ";": "semicolon", "<": "less",
    "=": "equal", ">": "greater", "?": "question", "@": "at", "[": "bracketleft", "\\": "backslash",
    "]": "bracketright", "^": "asciicircum", "_": "underscore", "`": "grave", "{": "braceleft", "|": "bar",
    "}": "braceright", "~": "asciitilde",
}


class ActionError(DockyardError, ValueError):
    """A reply's action cannot be accepted; the message says which part and why (the agent sees it)."""


@dataclass
class ParsedActions:
    actions: list[dict] = field(default_factory=list)
    special: str | None = None      # WAIT, DONE or FAIL


def keysym(name) -> str:
    if not isinstance(name, str) or not name:
        raise ActionError(f"a key must be a non-empty string, got {name!r}")
    lowered = name.lower()
    if lowered in NAMED_KEYS:
        return NAMED_KEYS[name if name in NAMED_KEYS else lowered]
    if len(name) == 1:
        if name.isalnum() and name.isascii():
            return name
        if name in PUNCTUATION:
            return PUNCTUATION[name]
    raise ActionError(f"unknown key {name!r}")


class Screen:
    def __init__(self, width: int, height: int):
        self.width, self.height = width, height

    def point(self, x, y, what: str) -> dict:
        if x is None and y is None:
            return {}
        for value, axis, limit in ((x, "x", self.width), (y, "y", self.height)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ActionError(f"{what}: {axis} must be a number, got {value!r}")
            if not 0 <= value < limit:
                raise ActionError(f"{what}: {axis}={value} is off the {self.width}x{self.height} screen")
        return {"x": int(x), "y": int(y)}


def _button(value, what: str) -> str:
    if value not in ("left", "middle", "right"):
        raise ActionError(f"{what}: button must be left, middle or right, got {value!r}")
    return value


def _count(value, what: str, most: int = 50) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
        raise ActionError(f"{what}: expected a whole number from 0 to {most}, got {value!r}")
    return value


def _text(value, what: str) -> str:
    if not isinstance(value, str):
        raise ActionError(f"{what}: text must be a string, got {value!r}")
    if len(value) > MAX_TEXT:
        raise ActionError(f"{what}: {len(value)} characters to type; at most {MAX_TEXT} per action")
    return value


def _seconds(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_SLEEP_S:
        raise ActionError(f"{what}: seconds must be from 0 to {MAX_SLEEP_S:.0f}, got {value!r}")
    return float(value)


# --- pyautogui ------------------------------------------------------------------------------------

# name -> positional parameters (as pyautogui declares them); keyword-only extras are accepted and,
# where they only shape timing (duration, tween, interval, logScreenshot, _pause), ignored by design
SIGNATURES = {
    "moveTo": ("x", "y", "duration", "tween"), "moveRel": ("xOffset", "yOffset", "duration", "tween"),
    "move": ("xOffset", "yOffset", "duration", "tween"),
    "click": ("x", "y", "clicks", "interval", "button", "duration", "tween"),
    "doubleClick": ("x", "y", "interval", "button", "duration", "tween"),
    "tripleClick": ("x", "y", "interval", "button", "duration", "tween"),
    "rightClick": ("x", "y", "duration", "tween"), "middleClick": ("x", "y", "duration", "tween"),
    "mouseDown": ("x", "y", "button", "duration", "tween"), "mouseUp": ("x", "y", "button", "duration", "tween"),
    "dragTo": ("x", "y", "duration", "tween", "button", "mouseDownUp"),
    "scroll": ("clicks", "x", "y"), "vscroll": ("clicks", "x", "y"), "hscroll": ("clicks", "x", "y"),
    "typewrite": ("message", "interval"), "write": ("message", "interval"),
    "press": ("keys", "presses", "interval"), "hotkey": None, "keyDown": ("key",), "keyUp": ("key",),
}
TIMING = {"duration", "tween", "interval", "logScreenshot", "_pause", "mouseDownUp"}
ALLOWED = sorted(f"pyautogui.{name}" for name in SIGNATURES) + ["time.sleep"]


def _literal(node: ast.AST, what: str):
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise ActionError(f"{what}: arguments must be literals (numbers, strings, lists), "
                          f"not {ast.unparse(node)[:80]!r}") from None


def _call_name(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return f"{func.value.id}.{func.attr}"
    return ast.unparse(func)[:80]


def _bind(name: str, call: ast.Call) -> dict:
    what = f"pyautogui.{name}"
    if name == "hotkey":
        if call.keywords and any(k.arg not in TIMING for k in call.keywords):
            raise ActionError(f"{what}: takes key names (and interval) only")
        return {"keys": [_literal(arg, what) for arg in call.args]}
    params = SIGNATURES[name]
    if len(call.args) > len(params):
        raise ActionError(f"{what}: takes at most {len(params)} positional arguments")
    bound = {param: _literal(arg, what) for param, arg in zip(params, call.args)}
    for keyword in call.keywords:
        if keyword.arg is None or (keyword.arg not in params and keyword.arg not in TIMING):
            raise ActionError(f"{what}: unexpected argument {keyword.arg or '**'!r}")
        bound[keyword.arg] = _literal(keyword.value, what)
    return bound


def _pyautogui_action(name: str, args: dict, screen: Screen) -> list[dict]:
    what = f"pyautogui.{name}"
    point = lambda: screen.point(args.get("x"), args.get("y"), what)   # noqa: E731
    if name == "moveTo":
        return [{"kind": "move", **screen.point(args.get("x"), args.get("y"), what)}] if "x" in args else []
    if name in ("moveRel", "move"):
        dx, dy = args.get("xOffset", 0) or 0, args.get("yOffset", 0) or 0
        for value in (dx, dy):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ActionError(f"{what}: offsets must be numbers")
        return [{"kind": "move_rel", "dx": int(dx), "dy": int(dy)}]
    if name in ("click", "doubleClick", "tripleClick", "rightClick", "middleClick"):
        clicks = {"doubleClick": 2, "tripleClick": 3}.get(name, _count(args.get("clicks", 1), what, 10))
        button = {"rightClick": "right", "middleClick": "middle"}.get(name) or _button(args.get("button", "left"), what)
        return [{"kind": "click", **point(), "clicks": clicks, "button": button}]
    if name in ("mouseDown", "mouseUp"):
        return [{"kind": "mouse_down" if name == "mouseDown" else "mouse_up", **point(),
                 "button": _button(args.get("button", "left"), what)}]
    if name == "dragTo":
        return [{"kind": "drag", **screen.point(args.get("x"), args.get("y"), what),
                 "button": _button(args.get("button", "left"), what)}]
    if name in ("scroll", "vscroll", "hscroll"):
        clicks = args.get("clicks")
        if isinstance(clicks, bool) or not isinstance(clicks, (int, float)) or abs(clicks) > 50:
            raise ActionError(f"{what}: clicks must be a number from -50 to 50, got {clicks!r}")
        axis = "dx" if name == "hscroll" else "dy"
        return [{"kind": "scroll", **point(), axis: int(clicks)}]
    if name in ("typewrite", "write"):
        message = args.get("message")
        if isinstance(message, list):   # pyautogui presses each named key in turn
            return [{"kind": "keys", "keys": [keysym(key) for key in message]}] if message else []
        return [{"kind": "type", "text": _text(message, what)}]
    if name == "press":
        keys = args.get("keys")
        keys = [keys] if isinstance(keys, str) else keys
        if not isinstance(keys, list) or not keys:
            raise ActionError(f"{what}: keys must be a key name or a list of them")
        presses = _count(args.get("presses", 1), what, 50)
        return [{"kind": "keys", "keys": [keysym(key) for key in keys] * presses}] if presses else []
    if name == "hotkey":
        keys = args["keys"]
        if len(keys) == 1 and isinstance(keys[0], list):
            keys = keys[0]
        if not keys:
            raise ActionError(f"{what}: needs at least one key")
        return [{"kind": "hotkey", "keys": [keysym(key) for key in keys]}]
    if name in ("keyDown", "keyUp"):
        return [{"kind": "key_down" if name == "keyDown" else "key_up", "key": keysym(args.get("key"))}]
    raise ActionError(f"{what} is not allowed")   # unreachable: SIGNATURES and this list agree


def parse_pyautogui(code: str, screen: Screen) -> list[dict]:
    """Checked action records for a block of pyautogui code (ActionError naming what is refused)."""
    try:
        tree = ast.parse(code)
    except SyntaxError as err:
        raise ActionError(f"the code does not parse: {err.msg} (line {err.lineno})") from None
    actions: list[dict] = []
    for statement in tree.body:
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            modules = [alias.name for alias in statement.names] if isinstance(statement, ast.Import) \
                else [statement.module or ""]
            if any(module not in ("pyautogui", "time") for module in modules) or \
                    any(alias.asname for alias in statement.names) or isinstance(statement, ast.ImportFrom):
                raise ActionError(f"only `import pyautogui` and `import time` are allowed, not "
                                  f"{ast.unparse(statement)[:80]!r}")
            continue
        if not (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call)):
            raise ActionError(f"each line must be one call of an allowed function; {ast.unparse(statement)[:80]!r} "
                              f"is not (allowed: {', '.join(ALLOWED)})")
        call = statement.value
        name = _call_name(call)
        if name == "time.sleep":
            if len(call.args) != 1 or call.keywords:
                raise ActionError("time.sleep takes one argument")
            actions.append({"kind": "sleep", "seconds": _seconds(_literal(call.args[0], name), name)})
            continue
        module, _, function = name.partition(".")
        if module != "pyautogui" or function not in SIGNATURES:
            raise ActionError(f"{name} is not allowed (allowed: {', '.join(ALLOWED)})")
        actions += _pyautogui_action(function, _bind(function, call), screen)
        if len(actions) > MAX_ACTIONS:
            raise ActionError(f"more than {MAX_ACTIONS} actions in one reply")
    return actions


# --- computer_13 ----------------------------------------------------------------------------------

COMPUTER_13 = ("MOVE_TO", "CLICK", "MOUSE_DOWN", "MOUSE_UP", "RIGHT_CLICK", "DOUBLE_CLICK", "DRAG_TO", "SCROLL",
               "TYPING", "PRESS", "KEY_DOWN", "KEY_UP", "HOTKEY")


def _computer_13_action(record: dict, screen: Screen) -> list[dict]:
    kind = record.get("action_type")
    what = f"action_type {kind!r}"
    params = {key: value for key, value in record.items() if key != "action_type"}
    point = lambda: screen.point(params.get("x"), params.get("y"), what)   # noqa: E731
    if kind == "MOVE_TO":
        return [{"kind": "move", **screen.point(params.get("x"), params.get("y"), what)}]
    if kind == "CLICK":
        return [{"kind": "click", **point(), "clicks": _count(params.get("num_clicks", 1), what, 10),
                 "button": _button(params.get("button", "left"), what)}]
    if kind in ("MOUSE_DOWN", "MOUSE_UP"):
        return [{"kind": kind.lower(), "button": _button(params.get("button", "left"), what)}]
    if kind == "RIGHT_CLICK":
        return [{"kind": "click", **point(), "clicks": 1, "button": "right"}]
    if kind == "DOUBLE_CLICK":
        return [{"kind": "click", **point(), "clicks": 2, "button": "left"}]
    if kind == "DRAG_TO":
        return [{"kind": "drag", **screen.point(params.get("x"), params.get("y"), what), "button": "left"}]
    if kind == "SCROLL":
        dx, dy = params.get("dx", 0), params.get("dy", 0)
        for value in (dx, dy):
            if isinstance(value, bool) or not isinstance(value, int) or abs(value) > 50:
                raise ActionError(f"{what}: dx and dy must be whole numbers from -50 to 50")
        return [{"kind": "scroll", "dx": dx, "dy": dy}]
    if kind == "TYPING":
        return [{"kind": "type", "text": _text(params.get("text"), what)}]
    if kind == "PRESS":
        return [{"kind": "keys", "keys": [keysym(params.get("key"))]}]
    if kind in ("KEY_DOWN", "KEY_UP"):
        return [{"kind": kind.lower(), "key": keysym(params.get("key"))}]
    if kind == "HOTKEY":
        keys = params.get("keys")
        if not isinstance(keys, list) or not keys:
            raise ActionError(f"{what}: keys must be a non-empty list")
        return [{"kind": "hotkey", "keys": [keysym(key) for key in keys]}]
    raise ActionError(f"unknown action_type {kind!r} (known: {', '.join(COMPUTER_13 + SPECIALS)})")


def parse_computer_13(text: str, screen: Screen) -> ParsedActions:
    try:
        value = json.loads(text)
    except ValueError as err:
        raise ActionError(f"the action is not valid JSON: {err}") from None
    records = value if isinstance(value, list) else [value]
    parsed = ParsedActions()
    for record in records:
        if not isinstance(record, dict) or "action_type" not in record:
            raise ActionError("each action must be an object with an action_type")
        if record["action_type"] in SPECIALS:
            if len(records) != 1:
                raise ActionError(f"{record['action_type']} must be the only action of its reply")
            parsed.special = record["action_type"]
            return parsed
        parsed.actions += _computer_13_action(record, screen)
    if len(parsed.actions) > MAX_ACTIONS:
        raise ActionError(f"more than {MAX_ACTIONS} actions in one reply")
    return parsed


# --- replies --------------------------------------------------------------------------------------

def parse_reply(reply: str, action_space: str, screen: Screen) -> ParsedActions:
    """The reply's action(s): the fenced blocks (all of them, in order, as OSWorld runs them); a reply
    without a block counts when its last line is WAIT, DONE or FAIL."""
    blocks = [body.strip() for _, body in _BLOCK.findall(reply)]
    if not blocks:
        if "```" in reply:
            raise ActionError("a code block was opened and not closed")
        last = reply.strip().splitlines()[-1].strip() if reply.strip() else ""
        if last in SPECIALS:
            return ParsedActions(special=last)
        raise ActionError("no action: put the action in a ``` block" if action_space == "pyautogui"
                          else "no action: put the JSON action in a ``` block")
    specials = [block for block in blocks if block in SPECIALS]
    if specials:
        if len(blocks) != 1:
            raise ActionError(f"{specials[0]} must be the only block of its reply")
        return ParsedActions(special=specials[0])
    parsed = ParsedActions()
    for block in blocks:
        if action_space == "pyautogui":
            parsed.actions += parse_pyautogui(block, screen)
        else:
            more = parse_computer_13(block, screen)
            if more.special:
                if len(blocks) != 1:
                    raise ActionError(f"{more.special} must be the only action of its reply")
                return more
            parsed.actions += more.actions
    if len(parsed.actions) > MAX_ACTIONS:
        raise ActionError(f"more than {MAX_ACTIONS} actions in one reply")
    return parsed
