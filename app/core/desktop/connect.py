"""Ready settings for the apps people point at Hearth ("connect an app"): the base
URL each one wants, its key, the model id, the environment variables it reads, a snippet to
paste into its settings, and the context length it needs to work.

Pure: the caller says where the server is and which model and key to use. The snippets follow
each tool's own documented settings (checked against its documentation, 2026-12): nothing here
writes another app's files.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

from app.core.types import LocalModel
from app.errors import InvalidRequest

# the key a tool is given when the server needs none: every one of them refuses an empty key
NO_KEY = "hearth"
# shown where a key is needed but none was given (the server keeps only hashes of its keys)
KEY_PLACEHOLDER = "<your Hearth API key>"


@dataclass(frozen=True, slots=True)
class Target:
    """Where a tool reaches Hearth: ``root`` without ``/v1`` (``http://127.0.0.1:1234``)."""

    root: str
    model: str
    key: str | None  # None: the server needs no key
    key_required: bool = False

    @property
    def v1(self) -> str:
        return self.root + "/v1"

    @property
    def shown_key(self) -> str:
        if self.key:
            return self.key
        return KEY_PLACEHOLDER if self.key_required else NO_KEY


@dataclass(frozen=True, slots=True)
class Connection:
    """``hearth connect TOOL --json``: {tool, base_url, model, env, snippet, context_needed}."""

    tool: str
    title: str
    base_url: str
    model: str
    env: dict[str, str]
    snippet: str
    snippet_language: str  # yaml | json | toml | python | shell | text
    context_needed: int
    notes: tuple[str, ...] = field(default_factory=tuple)

    def as_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["notes"] = list(self.notes)
        return d


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    title: str
    context_needed: int
    build: Callable[[Target, int], Connection]
    fim: bool = False  # editor autocomplete: the model must fill in the middle


def _continue(t: Target, ctx: int) -> Connection:
    snippet = (
        "# ~/.continue/config.yaml (or the workspace's .continue/config.yaml)\n"
        "name: Hearth\nversion: 0.0.1\nschema: v1\nmodels:\n"
        f"  - name: {t.model} (Hearth)\n    provider: openai\n    model: {t.model}\n"
        f"    apiBase: {t.v1}\n    apiKey: {t.shown_key}\n"
        "    roles: [chat, edit, apply]\n"
        f"    defaultCompletionOptions:\n      contextLength: {ctx}\n"
    )
    return Connection(
        "continue", "Continue", t.v1, t.model, {}, snippet, "yaml", ctx,
        ("Continue reads its settings file, not environment variables.",),
    )  # fmt: skip


def _cline(t: Target, ctx: int) -> Connection:
    snippet = (
        "Cline › Settings (gear icon) › API Configuration:\n"
        "  API Provider:        OpenAI Compatible\n"
        f"  Base URL:            {t.v1}\n"
        f"  API Key:             {t.shown_key}\n"
        f"  Model ID:            {t.model}\n"
        f"  Model Configuration › Context Window Size: {ctx}\n"
    )
    return Connection(
        "cline", "Cline", t.v1, t.model, {}, snippet, "text", ctx,
        ("Cline keeps its settings in VS Code, not in environment variables: they are "
         "entered in its settings panel.",
         "Cline's system prompt is long: a small context fails on the first request."),
    )  # fmt: skip


def _zed(t: Target, ctx: int) -> Connection:
    settings = {
        "language_models": {
            "openai_compatible": {
                "Hearth": {
                    "api_url": t.v1,
                    "available_models": [
                        {
                            "name": t.model,
                            "display_name": f"{t.model} (Hearth)",
                            "max_tokens": ctx,
                            "capabilities": {"tools": True, "images": False},
                        }
                    ],
                }
            }
        }
    }
    snippet = "// Zed: settings.json (zed: open settings)\n" + json.dumps(settings, indent=2) + "\n"
    return Connection(
        "zed", "Zed", t.v1, t.model, {"HEARTH_API_KEY": t.shown_key}, snippet, "json", ctx,
        ("Zed reads the key of a provider named Hearth from HEARTH_API_KEY, or from its "
         "Agent settings (stored in the keychain), never from settings.json.",),
    )  # fmt: skip


def _open_webui(t: Target, ctx: int) -> Connection:
    env = {"OPENAI_API_BASE_URL": t.v1, "OPENAI_API_KEY": t.shown_key, "DEFAULT_MODELS": t.model}
    docker_root = t.v1.replace("127.0.0.1", "host.docker.internal").replace(
        "localhost", "host.docker.internal"
    )
    snippet = (
        "# Open WebUI installed with pip:\n"
        + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        + " open-webui serve\n\n# in Docker (the container reaches this machine as host.docker.internal):\n"
        "docker run -d -p 3000:8080 --add-host=host.docker.internal:host-gateway \\\n"
        f"  -e OPENAI_API_BASE_URL={shlex.quote(docker_root)} \\\n"
        f"  -e OPENAI_API_KEY={shlex.quote(t.shown_key)} -e DEFAULT_MODELS={shlex.quote(t.model)} \\\n"
        "  -v open-webui:/app/backend/data ghcr.io/open-webui/open-webui:main\n"
    )
    return Connection(
        "open-webui", "Open WebUI", t.v1, t.model, env, snippet, "shell", ctx,
        ("From Docker, Hearth must listen on an address the container can reach "
         "(Server page › Host, e.g. 0.0.0.0, with an API key).",
         "Or Admin Panel › Settings › Connections › OpenAI API: the same URL and key."),
    )  # fmt: skip


def _claude_code(t: Target, ctx: int) -> Connection:
    env = {
        "ANTHROPIC_BASE_URL": t.root,  # Claude Code appends /v1/messages itself
        "ANTHROPIC_AUTH_TOKEN": t.shown_key,
        "ANTHROPIC_MODEL": t.model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": t.model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": t.model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": t.model,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    snippet = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()) + "claude\n"
    return Connection(
        "claude-code", "Claude Code", t.root, t.model, env, snippet, "shell", ctx,
        ("Claude Code speaks Anthropic's Messages API: Hearth answers it at /v1/messages.",
         "Its system prompt and tool definitions are long: 32,768 tokens of context is the "
         "least that works, 65,536 is better."),
    )  # fmt: skip


def _codex(t: Target, ctx: int) -> Connection:
    snippet = (
        "# ~/.codex/config.toml\n"
        f'model = "{t.model}"\nmodel_provider = "hearth"\n\n'
        "[model_providers.hearth]\n"
        'name = "Hearth"\n'
        f'base_url = "{t.v1}"\n'
        'env_key = "HEARTH_API_KEY"\n'
        'wire_api = "responses"\n'
    )
    env = {"HEARTH_API_KEY": t.shown_key, "OPENAI_BASE_URL": t.v1, "OPENAI_API_KEY": t.shown_key}
    return Connection(
        "codex", "OpenAI Codex CLI", t.v1, t.model, env, snippet, "toml", ctx,
        ("Codex calls the Responses API (/v1/responses), which Hearth serves.",
         f"Without the config file: codex -m {t.model} with OPENAI_BASE_URL and "
         "OPENAI_API_KEY set (hearth connect codex --exec -- codex)."),
    )  # fmt: skip


def _openai_python(t: Target, ctx: int) -> Connection:
    env = {"OPENAI_BASE_URL": t.v1, "OPENAI_API_KEY": t.shown_key}
    snippet = (
        "from openai import OpenAI\n\n"
        f'client = OpenAI(base_url="{t.v1}", api_key="{t.shown_key}")\n'
        "reply = client.chat.completions.create(\n"
        f'    model="{t.model}",\n'
        '    messages=[{"role": "user", "content": "Hello!"}],\n'
        ")\nprint(reply.choices[0].message.content)\n"
    )
    return Connection(
        "openai-python", "openai-python", t.v1, t.model, env, snippet, "python", ctx,
        ("With OPENAI_BASE_URL and OPENAI_API_KEY set, OpenAI() needs no arguments.",),
    )  # fmt: skip


def _langchain(t: Target, ctx: int) -> Connection:
    env = {"OPENAI_BASE_URL": t.v1, "OPENAI_API_BASE": t.v1, "OPENAI_API_KEY": t.shown_key}
    snippet = (
        "from langchain_openai import ChatOpenAI\n\n"
        f'llm = ChatOpenAI(model="{t.model}", base_url="{t.v1}", api_key="{t.shown_key}")\n'
        'print(llm.invoke("Hello!").content)\n'
    )
    return Connection(
        "langchain", "LangChain", t.v1, t.model, env, snippet, "python", ctx,
        ("pip install langchain-openai; OpenAIEmbeddings works the same way with an embedding "
         "model's id (check_embedding_ctx_length=False).",),
    )  # fmt: skip


def _continue_autocomplete(t: Target, ctx: int) -> Connection:
    key = f"    apiKey: {t.shown_key}\n" if t.key or t.key_required else ""
    old = {
        "tabAutocompleteModel": {
            "title": f"{t.model} (Hearth)",
            "provider": "ollama",
            "model": t.model,
            "apiBase": t.root + "/",
            **({"apiKey": t.shown_key} if t.key or t.key_required else {}),
        }
    }
    snippet = (
        "# ~/.continue/config.yaml: tab autocomplete through Hearth's Ollama API\n"
        "models:\n"
        f"  - name: {t.model} autocomplete (Hearth)\n    provider: ollama\n"
        f"    model: {t.model}\n    apiBase: {t.root}/\n{key}"
        "    roles: [autocomplete]\n"
        f"    defaultCompletionOptions:\n      contextLength: {ctx}\n"
        "\n# or, in the older ~/.continue/config.json:\n"
        + "".join(f"# {line}\n" for line in json.dumps(old, indent=2).splitlines())
    )
    return Connection(
        "continue-autocomplete", "Continue (tab autocomplete)", t.root, t.model, {}, snippet,
        "yaml", ctx,
        ("Continue reads its settings file, not environment variables.",
         "Continue's Ollama provider sends the text before and after the cursor (prompt and "
         "suffix) to /api/generate; Hearth builds the model's fill-in-the-middle prompt.",
         "Chat in Continue: hearth connect continue (the same file, another model entry)."),
    )  # fmt: skip


def _llama_vscode(t: Target, ctx: int) -> Connection:
    settings = {"llama-vscode.endpoint": t.root}
    if t.key or t.key_required:
        settings["llama-vscode.api_key"] = t.shown_key
    snippet = (
        f"// VS Code: settings.json (Hearth's default model answers: {t.model})\n"
        + json.dumps(settings, indent=2)
        + "\n"
    )
    return Connection(
        "llama-vscode", "llama.vscode", t.root, t.model, {}, snippet, "json", ctx,
        ("llama.vscode keeps its settings in VS Code, not in environment variables.",
         "llama.vscode (and llama.vim) call llama-server's /infill, which Hearth serves.",
         f"It names no model: Hearth answers it with the default model (default_model in "
         f"settings), which should be '{t.model}'."),
    )  # fmt: skip


def _twinny(t: Target, ctx: int) -> Connection:
    u = urlsplit(t.root)
    fields = [
        ("Label", "Hearth autocomplete"),
        ("Type", "fim"),
        ("Provider", "lmstudio"),
        ("Protocol", u.scheme),
        ("Hostname", u.hostname or "127.0.0.1"),
        ("Port", str(u.port or (443 if u.scheme == "https" else 80))),
        ("API Path", "/v1/completions"),
        ("Model Name", t.model),
        ("FIM Template", "automatic"),
    ]
    if t.key or t.key_required:
        fields.append(("API Key", t.shown_key))
    snippet = f"# Twinny: in its Providers tab, a provider for {t.root}/v1/completions\n" + "".join(
        f"{name}: {value}\n" for name, value in fields
    )
    return Connection(
        "twinny", "Twinny", t.root, t.model, {}, snippet, "text", ctx,
        ("Twinny keeps its providers in VS Code's extension storage, not in environment "
         "variables: enter them in its Providers tab.",
         "Twinny writes the fill-in-the-middle prompt itself, with the markers of the template "
         "it picks: 'automatic' picks it from the model's name; otherwise choose the model's "
         "family (codeqwen for Qwen2.5-Coder, starcoder for StarCoder2, deepseek, codellama).",
         "The LM Studio provider sends an OpenAI completions body, whose prompt's markers Hearth "
         "reads as the model's own tokens. Its Ollama provider sends no 'raw', so Hearth (like "
         "Ollama with a chat model) would wrap the prompt in the chat template: use lmstudio."),
    )  # fmt: skip


# the context each tool needs to work at all (its own system prompt and tool definitions, plus
# room for a conversation): what the warning compares the model's context with
TOOLS: dict[str, Tool] = {
    t.name: t
    for t in (
        Tool("continue", "Continue", 8192, _continue),
        Tool("cline", "Cline", 32768, _cline),
        Tool("zed", "Zed", 16384, _zed),
        Tool("open-webui", "Open WebUI", 4096, _open_webui),
        Tool("claude-code", "Claude Code", 32768, _claude_code),
        Tool("codex", "OpenAI Codex CLI", 32768, _codex),
        Tool("openai-python", "openai-python", 2048, _openai_python),
        Tool("langchain", "LangChain", 2048, _langchain),
        # autocomplete: a prefix and suffix window, other files' lines, and the answer
        Tool(
            "continue-autocomplete",
            "Continue (tab autocomplete)",
            4096,
            _continue_autocomplete,
            fim=True,
        ),
        Tool("llama-vscode", "llama.vscode", 4096, _llama_vscode, fim=True),
        Tool("twinny", "Twinny", 4096, _twinny, fim=True),
    )  # fmt: skip
}


def connection(tool: str, target: Target) -> Connection:
    """The settings for ``tool`` (one of :data:`TOOLS`).

    Raises:
        InvalidRequest: an unknown tool.
    """
    spec = TOOLS.get(tool)
    if spec is None:
        raise InvalidRequest(f"unknown tool '{tool}' (one of: {', '.join(TOOLS)})", param="tool")
    return spec.build(target, spec.context_needed)


@dataclass(frozen=True, slots=True)
class ContextCheck:
    """Whether a model's context is enough for a tool: ``ok``, and what to say when not."""

    ok: bool
    message: str = ""
    can_raise: bool = False  # a larger context is possible (the model was trained for it)


def check_context(
    needed: int, model: str, *, current: int | None, trained: int | None, auto_cap: int | None
) -> ContextCheck:
    """``current``: the context the model is loaded with, or will load with (None: auto, up to
    ``auto_cap``); ``trained``: the model's trained length (None: unknown)."""
    if trained and trained < needed:
        return ContextCheck(
            False,
            f"'{model}' was trained for {trained:,} tokens of context; this tool needs "
            f"{needed:,}: choose a model with a longer context",
        )
    if current is None:
        reach = min(x for x in (trained, auto_cap) if x) if (trained or auto_cap) else None
        if reach is None or reach >= needed:
            return ContextCheck(True)
        return ContextCheck(
            False,
            f"'{model}' loads with an automatic context of at most {reach:,} tokens; this tool "
            f"needs {needed:,}",
            can_raise=True,
        )
    if current >= needed:
        return ContextCheck(True)
    return ContextCheck(
        False,
        f"'{model}' runs with a {current:,}-token context; this tool needs {needed:,}",
        can_raise=True,
    )


def pick_model(
    default_model: str, models: Iterable[LocalModel], capability: str = "chat"
) -> str | None:
    """The model a tool is connected to when none is asked for: ``default_model`` (settings),
    else the library's first chat model; None when there is none. For autocomplete
    (``capability`` "fim"), the library's first model that fills in the middle unless the
    default model does; when none does, the chat pick."""
    if capability == "chat" and default_model:
        return default_model
    listed = list(models)
    if any(m.id == default_model and capability in m.capabilities for m in listed):
        return default_model
    found = next((m.id for m in listed if capability in m.capabilities), None)
    if found or capability == "chat":
        return found
    # none can: the chat pick, so the settings still come (with the check's warning)
    return pick_model(default_model, listed)


def known_capabilities(model: LocalModel) -> tuple[str, ...] | None:
    """A library model's capabilities where the library looked for FIM tokens; None (unknown)
    for one indexed before it did, or a format it does not look into (an MLX folder)."""
    return model.capabilities if "fim" in model.extra else None


def check_fim(tool: str, model: str, capabilities: Iterable[str] | None) -> ContextCheck:
    """Whether ``model`` suits ``tool``: an autocomplete tool needs a model that fills in the
    middle. ``capabilities``: None when unknown (a provider's model says nothing)."""
    spec = TOOLS.get(tool)
    if spec is None or not spec.fim or capabilities is None or "fim" in capabilities:
        return ContextCheck(True)
    return ContextCheck(
        False,
        f"'{model}' cannot fill in the middle (its vocabulary has no prefix, suffix and middle "
        "tokens): autocomplete needs a code model trained for it, such as Qwen2.5-Coder, "
        "StarCoder2, CodeLlama or DeepSeek-Coder",
    )


def effective_context(*, loaded: int | None, preset: int | None, default: int | None) -> int | None:
    """The context a model runs with (``loaded``), else the one it will load with: its preset's,
    else the settings' load.context_length; None: automatic (0 in settings is auto)."""
    return loaded or preset or default or None


def with_context(preset: dict[str, Any], needed: int) -> dict[str, Any]:
    """The model's preset with ``context_length`` raised to what the tool needs."""
    return {**preset, "context_length": needed}
