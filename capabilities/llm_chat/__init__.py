"""``llm.chat@2.0``: chat with a model, tools answered by the caller (spec §5).

:func:`build_llm_chat` makes the capability from the ``[llm]`` configuration section;
the node offers it only when a model server URL is configured or the demo model is on.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from capabilities.llm_chat.backends import ChatBackend
from capabilities.llm_chat.backends.demo import DemoBackend, DemoScript
from capabilities.llm_chat.backends.openai import OpenAIBackend
from capabilities.llm_chat.capability import LlmChat
from hearthnet.config import LlmSection

__all__ = ["LlmChat", "build_llm_chat"]


def build_llm_chat(cfg: LlmSection, env: Mapping[str, str] | None = None) -> LlmChat | None:
    """The capability for ``cfg``, or None when neither ``url`` nor ``demo`` is set.

    The API key is read from the environment variable ``cfg.api_key_env`` (never from
    the configuration file, so ``hearthnet config show`` does not print it).

    Raises:
        ConfigError: the demo script file is unreadable or not a script.
    """
    env = os.environ if env is None else env
    backends: dict[str, ChatBackend] = {}
    if cfg.url:
        backends["openai"] = OpenAIBackend(
            cfg.url,
            model=cfg.model,
            api_key=env.get(cfg.api_key_env) or None,
            max_tokens=cfg.max_tokens,
            request_timeout_s=cfg.request_timeout_s,
        )
    if cfg.demo:
        script = DemoScript.load(Path(cfg.demo_script).expanduser()) if cfg.demo_script else None
        backends["demo"] = DemoBackend(script)
    return LlmChat(cfg, backends) if backends else None
