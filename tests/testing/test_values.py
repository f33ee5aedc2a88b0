"""How values change across RPC and SQL: each rule is production's conversion."""

import datetime

import pytest

from durability.testing import JsDict, JsException
from durability.testing._values import rpc_copy, sql_binding, sql_value


def test_dicts_arrive_as_jsdicts_with_string_keys_and_attribute_access():
    value = rpc_copy({"a": {"b": [1, {"c": None}]}, 1: "one"})
    assert value == {"a": {"b": [1, {"c": None}]}, "1": "one"}
    assert isinstance(value, JsDict) and isinstance(value["a"], JsDict)
    assert value.a.b[1].c is None
    with pytest.raises(AttributeError):
        value.missing  # noqa: B018 (the access is what raises)


def test_whole_floats_arrive_as_ints_others_unchanged():
    # Pyodide turns a JavaScript number that is whole and safe into an int.
    assert rpc_copy(2.0) == 2 and type(rpc_copy(2.0)) is int
    assert rpc_copy(2.5) == 2.5
    assert type(rpc_copy(2.0**60)) is float  # beyond 2**53: stays a float
    assert rpc_copy(2**60) == 2**60  # a big int travels as a BigInt
    assert rpc_copy(True) is True


def test_sets_bytes_and_datetimes():
    assert rpc_copy({1, 2}) == {1, 2}
    assert bytes(rpc_copy(b"ab")) == b"ab"
    aware = datetime.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=datetime.UTC)
    # A JS Date holds whole milliseconds and comes back naive (UTC).
    assert rpc_copy(aware) == datetime.datetime(2026, 1, 2, 3, 4, 5, 678000)


@pytest.mark.parametrize("value", [(1, 2), bytearray(b"x"), [1, (2,)], {"a": (1,)}])
def test_tuples_and_bytearrays_are_refused_with_the_sdks_error(value):
    with pytest.raises(TypeError, match="cannot be sent over RPC"):
        rpc_copy(value)


def test_custom_objects_fail_with_a_data_clone_error():
    class Thing:
        pass

    with pytest.raises(JsException) as caught:
        rpc_copy({"x": Thing()})
    assert caught.value.name == "DataCloneError"


def test_copies_are_independent():
    original = {"items": [1, 2]}
    copy = rpc_copy(original)
    copy["items"].append(3)
    assert original == {"items": [1, 2]}


def test_sql_bindings_are_converted_as_workerd_binds_them():
    assert sql_binding(3) == 3.0 and type(sql_binding(3)) is float  # numbers bind as REAL
    assert sql_binding(None) is None and sql_binding("x") == "x" and sql_binding(b"x") == b"x"
    with pytest.raises(TypeError, match="bool"):
        sql_binding(True)
    with pytest.raises(TypeError, match="2\\*\\*53"):
        sql_binding(2**53 + 1)
    with pytest.raises(TypeError):
        sql_binding([1])


def test_sql_values_read_back_as_javascript_numbers():
    assert sql_value(2.0) == 2 and type(sql_value(2.0)) is int
    assert sql_value(9007199254740993) == 9007199254740992.0  # rounded, as in production
    assert sql_value(5) == 5 and sql_value("s") == "s" and sql_value(None) is None


def test_a_str_enum_member_crosses_rpc_as_a_plain_string():
    from durability.semaphore.messages import ReportStatus

    copied = rpc_copy({"status": ReportStatus.OK, "list": [ReportStatus.SETTLED]})
    assert type(copied["status"]) is str and copied["status"] == "ok"
    assert type(copied["list"][0]) is str
