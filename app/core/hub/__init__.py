"""The Hugging Face Hub: references (``refs``), the pure catalog (``catalog``) and the client over
huggingface_hub (``client``). Everything public is importable from ``app.core.hub``.
"""

from __future__ import annotations

from app.core.hub.catalog import (
    DEFAULT_QUANT,
    MLX_SKIP,
    MLX_SUFFIXES,
    PICKLE_SUFFIXES,
    SEARCH_EXPAND,
    SORT_PARAMS,
    HubFormat,
    ModelSummary,
    RepoInfo,
    Sort,
    assess,
    choices,
    choose,
    group_gguf,
    mlx_files,
    remote_code_reason,
    size_range,
)
from app.core.hub.client import (
    HEADER_FIRST_READ,
    HEADER_MAX_READ,
    SIZE_CONCURRENCY,
    HubClient,
)
from app.core.hub.listing import Listing, ListingCache
from app.core.hub.reach import Reachability
from app.core.hub.refs import (
    HUB_HOSTS,
    REPO_ID_RE,
    HubRef,
    check_repo_id,
    check_repo_path,
    parse_ref,
)
from app.core.library.formats import SHARD_RE, ModelOption, RepoFile, quant_of

__all__ = [
    "DEFAULT_QUANT",
    "HEADER_FIRST_READ",
    "HEADER_MAX_READ",
    "HUB_HOSTS",
    "MLX_SKIP",
    "MLX_SUFFIXES",
    "PICKLE_SUFFIXES",
    "REPO_ID_RE",
    "SEARCH_EXPAND",
    "SHARD_RE",
    "SIZE_CONCURRENCY",
    "SORT_PARAMS",
    "HubClient",
    "HubFormat",
    "HubRef",
    "Listing",
    "ListingCache",
    "ModelOption",
    "ModelSummary",
    "RepoFile",
    "Reachability",
    "RepoInfo",
    "Sort",
    "assess",
    "check_repo_id",
    "check_repo_path",
    "choices",
    "choose",
    "group_gguf",
    "mlx_files",
    "parse_ref",
    "quant_of",
    "remote_code_reason",
    "size_range",
]
