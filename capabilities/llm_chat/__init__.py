"""``llm.chat@2.0``: chat with a model, tools answered by the caller (spec §5).

:func:`build_llm_chat` makes the capability from the ``[llm]`` configuration section;
the node offers it only when a model server URL is configured or the demo model is on.
"""

from __future__ import annotations

from pathlib import Path

from capabilities.llm_chat.backends import ChatBackend
from capabilities.llm_chat.backends.demo import DemoBackend, DemoScript
from capabilities.llm_chat.capability import LlmChat
from hearthnet.config import LlmSection

__all__ = ["LlmChat", "build_llm_chat"]


def build_llm_chat(cfg: LlmSection) -> LlmChat | None:
    """The capability for ``cfg``, or None when the demo model is not enabled.

    Raises:
        ConfigError: the demo script file is unreadable or not a script.
    """
    backends: dict[str, ChatBackend] = {}
    if cfg.demo:
        script = DemoScript.load(Path(cfg.demo_script).expanduser()) if cfg.demo_script else None
        backends["demo"] = DemoBackend(script)
    return LlmChat(cfg, backends) if backends else None
