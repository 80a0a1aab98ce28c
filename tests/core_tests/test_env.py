import pytest

from openrelay.lib.env import ImproperlyConfiguredEnv, envbool, envfloat, envint, envlist


def test_envbool_reads_and_rejects(monkeypatch):
    monkeypatch.setenv("X_FLAG", "yes")
    assert envbool("X_FLAG") is True
    monkeypatch.setenv("X_FLAG", "off")
    assert envbool("X_FLAG", True) is False
    monkeypatch.setenv("X_FLAG", "maybe")
    with pytest.raises(ImproperlyConfiguredEnv, match="X_FLAG"):
        envbool("X_FLAG")


def test_envint_rejects_garbage_and_minimum(monkeypatch):
    monkeypatch.setenv("X_INT", "12")
    assert envint("X_INT", 1) == 12
    monkeypatch.setenv("X_INT", "twelve")
    with pytest.raises(ImproperlyConfiguredEnv, match="integer"):
        envint("X_INT", 1)
    monkeypatch.setenv("X_INT", "0")
    with pytest.raises(ImproperlyConfiguredEnv, match=">= 1"):
        envint("X_INT", 5, minimum=1)


def test_envfloat_and_list(monkeypatch):
    monkeypatch.setenv("X_F", "1.5")
    assert envfloat("X_F", 0) == 1.5
    monkeypatch.setenv("X_F", "fast")
    with pytest.raises(ImproperlyConfiguredEnv):
        envfloat("X_F", 0)
    monkeypatch.setenv("X_L", " a.example, b.example ,")
    assert envlist("X_L") == ["a.example", "b.example"]
    monkeypatch.delenv("X_L")
    assert envlist("X_L", ["d"]) == ["d"]
