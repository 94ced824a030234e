"""Benchmark prompt suites: JSON files of prompts (benchmarks/suites/*.json in a checkout,
mlxspec/bench_suites/ when packaged; $MLXSPEC_BENCH_SUITES overrides)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import MlxspecError
from ..util.untrusted import read_json


@dataclass
class Prompt:
    suite: str
    id: str
    messages: list

    @property
    def key(self) -> str:
        return f"{self.suite}/{self.id}"


@dataclass
class Suite:
    name: str
    description: str
    prompts: list
    path: str = ""


def suite_dirs() -> list[Path]:
    """Where suites are looked for, in order."""
    here = Path(__file__).resolve().parent
    dirs = []
    env = os.environ.get("MLXSPEC_BENCH_SUITES")
    if env:
        dirs.append(Path(env).expanduser())
    dirs += [here.parent / "benchmarks" / "suites", here / "bench_suites", Path.cwd() / "benchmarks" / "suites"]
    return dirs


def find_suite_file(name: str) -> Path:
    p = Path(name).expanduser()
    if p.suffix == ".json" or p.is_file():
        if not p.is_file():
            raise MlxspecError(f"suite file not found: {p}")
        return p
    for d in suite_dirs():
        f = d / f"{name}.json"
        if f.is_file():
            return f
    available = sorted({f.stem for d in suite_dirs() if d.is_dir() for f in d.glob("*.json")})
    if not available:
        raise MlxspecError("no benchmark suites found (looked in " + ", ".join(map(str, suite_dirs()))
                           + "); pass --suite path/to/suite.json")
    raise MlxspecError(f"unknown suite {name!r}; available: {', '.join(available)} (or a path to a .json file)")


def parse_suite(data: dict, path: str = "") -> Suite:
    """Validate a suite document: {"name", "description", "prompts": [{"id", "prompt" | "messages"}]}."""
    where = path or "suite"
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
        raise MlxspecError(f"{where}: a suite needs a non-empty 'name'")
    prompts = data.get("prompts")
    if not isinstance(prompts, list) or not prompts:
        raise MlxspecError(f"{where}: a suite needs a non-empty 'prompts' list")
    out, seen = [], set()
    for i, p in enumerate(prompts):
        if not isinstance(p, dict) or not isinstance(p.get("id"), str) or not p["id"]:
            raise MlxspecError(f"{where}: prompt {i} needs an 'id'")
        if p["id"] in seen:
            raise MlxspecError(f"{where}: duplicate prompt id {p['id']!r}")
        seen.add(p["id"])
        if isinstance(p.get("messages"), list) and p["messages"]:
            messages = p["messages"]
            if not all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in messages):
                raise MlxspecError(f"{where}: prompt {p['id']!r}: messages need 'role' and 'content'")
        elif isinstance(p.get("prompt"), str) and p["prompt"].strip():
            messages = ([{"role": "system", "content": p["system"]}] if p.get("system") else []) + [
                {"role": "user", "content": p["prompt"]}]
        else:
            raise MlxspecError(f"{where}: prompt {p['id']!r} needs 'prompt' text or 'messages'")
        out.append(Prompt(data["name"], p["id"], messages))
    return Suite(data["name"], data.get("description", ""), out, path)


def load_suite(name: str) -> Suite:
    f = find_suite_file(name)
    data = read_json(f, f"suite {f}")
    return parse_suite(data, str(f))


def select_prompts(suites: list[Suite], per_suite: int) -> list[Prompt]:
    """The first `per_suite` prompts of each suite (0 = all), suite by suite."""
    out = []
    for s in suites:
        out += s.prompts if per_suite <= 0 else s.prompts[:per_suite]
    return out


def encode(tokenizer, prompt: Prompt) -> list[int]:
    """Chat template when the tokenizer has one (same ids for every contender), else the user text."""
    from ..api import encode_prompt

    if getattr(tokenizer, "chat_template", None):
        return encode_prompt(tokenizer, prompt.messages)
    return encode_prompt(tokenizer, "\n\n".join(m["content"] for m in prompt.messages))
