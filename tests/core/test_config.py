"""The one config loader (bestofn.core.config): every command that reads a config refuses a
field the schema refuses as ``error: <file>: config field <field>: <what>``, exit 2."""

import pytest
import yaml
from helpers import REPO

from bestofn.cli import main as bestofn
from bestofn.core.config import ConfigError, check_config, load_config
from bestofn.util.user_input import UserInputError


def bad_config(tmp_path):
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    config["takes"] = "many"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_defaults_are_filled_and_a_bad_field_is_named(tmp_path):
    config = load_config(REPO / "config/config.yaml")
    assert "export" in config and config["export"]["format"]  # the schema's defaults
    with pytest.raises(ConfigError, match="config field takes: 'many'"):
        check_config({**config, "takes": "many"})
    path = bad_config(tmp_path)
    with pytest.raises(UserInputError) as e:
        load_config(path)
    assert str(e.value).startswith(f"{path}: config field takes: 'many'")


@pytest.mark.parametrize(
    "argv",
    [
        ["check"],
        ["plan"],
        ["export", "--out", "{tmp}/out"],
        ["weights", "list"],
        ["select"],
    ],
)
def test_every_command_refuses_it_the_same_way(argv, tmp_path, capsys):
    path = bad_config(tmp_path)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert bestofn([*argv, "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: config field takes: 'many'"), err
    assert "Traceback" not in err
