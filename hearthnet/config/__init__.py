"""Configuration (spec §9): a TOML file, overridden by ``HEARTHNET_<SECTION>_<KEY>``
environment variables, overridden by command-line flags.

- :mod:`hearthnet.config.schema`: the sections, every key with its default and doc
  ([mesh] in :mod:`hearthnet.config.mesh_section`);
- :mod:`hearthnet.config.loading`: :class:`Config` and :func:`load_config`;
- :mod:`hearthnet.config.render`: ``hearthnet config show`` and the docs table.

Import from here: ``from hearthnet.config import Config, MeshSection, load_config``.
"""

from hearthnet.config.loading import Config, load_config, sections, stray_environment
from hearthnet.config.mesh_section import MeshSection
from hearthnet.config.render import configuration_table, documented_keys, to_toml
from hearthnet.config.schema import (
    GIB,
    KIB,
    MIB,
    BusSection,
    LimitsSection,
    LlmSection,
    NodeSection,
    PubSubSection,
    SecuritySection,
    TransportSection,
    data_dir_from_environment,
    default_data_dir,
    default_node_name,
)

__all__ = [
    "GIB",
    "KIB",
    "MIB",
    "BusSection",
    "Config",
    "LimitsSection",
    "LlmSection",
    "MeshSection",
    "NodeSection",
    "PubSubSection",
    "SecuritySection",
    "TransportSection",
    "configuration_table",
    "data_dir_from_environment",
    "default_data_dir",
    "default_node_name",
    "documented_keys",
    "load_config",
    "sections",
    "stray_environment",
    "to_toml",
]
