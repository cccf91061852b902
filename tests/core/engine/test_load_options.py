"""The load option table is the one description of the options: validation, presets, the
settings' load defaults and the CLI flags all follow it."""

from __future__ import annotations

import dataclasses

import pytest

from app.cli import build_parser
from app.cli.load_flags import load_options_from_args
from app.core.engine import load_options
from app.core.engine.load_options import SPECS, validate_load_options
from app.core.engine.presets import validate_options
from app.core.types import LoadOptions
from app.errors import ConfigError, InvalidRequest
from app.settings import settings_from_dict


@pytest.fixture
def parallel_up_to_3(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(SPECS, "parallel", dataclasses.replace(SPECS["parallel"], maximum=3))


def test_every_field_has_one_row_with_the_type_default() -> None:
    assert [s.name for s in load_options.specs()] == list(SPECS)
    assert set(SPECS) == {f.name for f in dataclasses.fields(LoadOptions)}
    for spec in SPECS.values():
        assert spec.default == getattr(LoadOptions(), spec.name)
        assert spec.help and spec.label and spec.flag.startswith("--")
        spec.check(spec.default)  # every default is valid by its own row
    assert len({s.flag for s in SPECS.values()}) == len(SPECS)


def test_validation_names_the_option_and_the_range() -> None:
    with pytest.raises(InvalidRequest) as ei:
        validate_load_options({"parallel": 17})
    assert ei.value.param == "options.parallel"
    assert ei.value.message == "'parallel' must be an integer in [1, 16]"
    for bad in ({"rope_freq_scale": float("nan")}, {"use_mlock": 1}, {"kv_type": "q2"}):
        with pytest.raises(InvalidRequest):
            validate_load_options(bad)
    assert validate_load_options({"rope_freq_base": 10000, "seed": None}) == {
        "rope_freq_base": 10000.0,
        "seed": None,
    }


def test_a_range_change_in_the_table_moves_every_refusal(parallel_up_to_3: None) -> None:
    # the API's and the presets' validation
    with pytest.raises(InvalidRequest) as ei:
        validate_options({"parallel": 4})
    assert "[1, 3]" in ei.value.message
    assert validate_options({"parallel": 3}) == {"parallel": 3}
    # the settings' load defaults
    with pytest.raises(ConfigError, match=r"load\.parallel must be an integer in \[1, 3\]"):
        settings_from_dict({"load": {"parallel": 4}})
    # the CLI: a usage error before anything runs
    for cmd in (["load", "m"], ["run", "m"], ["serve"]):
        with pytest.raises(SystemExit) as se:
            build_parser().parse_args([*cmd, "--parallel", "4"])
        assert se.value.code == 2
        args = build_parser().parse_args([*cmd, "--parallel", "3"])
        assert load_options_from_args(args) == {"parallel": 3}


def test_cli_flags_keep_their_names_and_map_to_options() -> None:
    args = build_parser().parse_args(
        "load m --ctx 1024 --gpu-layers 0 --threads 2 --batch 256 --kv-type q8_0 "
        "--flash-attention off --seed 7 --parallel 2 --no-mmap --mlock --ubatch 128 "
        "--rope-scaling yarn --rope-freq-base 10000 --rope-freq-scale 0.5 --wait".split()
    )
    opts = load_options_from_args(args)
    assert opts == {
        "context_length": 1024,
        "gpu_layers": 0,
        "threads": 2,
        "batch_size": 256,
        "kv_type": "q8_0",
        "flash_attention": "off",
        "seed": 7,
        "parallel": 2,
        "use_mmap": False,
        "use_mlock": True,
        "ubatch_size": 128,
        "rope_scaling": "yarn",
        "rope_freq_base": 10000.0,
        "rope_freq_scale": 0.5,
    }
    assert args.wait is True
    assert validate_options(opts) == opts
    # flags not given are not sent: they resolve as a fresh load would
    assert load_options_from_args(build_parser().parse_args(["load", "m"])) == {}
    with pytest.raises(SystemExit):
        build_parser().parse_args(["load", "m", "--kv-type", "q2"])
