"""top_rl.run.pickle_scan names what a pickle would import, whatever opcodes it uses, without unpickling it."""

from __future__ import annotations

import collections
import io
import pickle
import re

import pytest

from top_rl.run.pickle_scan import named_objects


class _Payload:
    def __reduce__(self):
        return exec, ("raise SystemExit('the scan ran the pickle')",)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_every_protocol_names_the_callable_and_the_classes(protocol):
    data = pickle.dumps({"a": [1, _Payload()], "b": collections.OrderedDict(x=1)}, protocol=protocol)
    assert named_objects(io.BytesIO(data)) == (["builtins.exec", "collections.OrderedDict"], None)


def test_plain_data_names_nothing():
    assert named_objects(io.BytesIO(pickle.dumps({"a": [1, 2.0, "s", b"b", (None, True)]}, protocol=4))) == ([], None)


def test_a_name_computed_while_unpickling_is_reported_as_such():
    """STACK_GLOBAL on a module name that a call returns (str("builtins")): no scan can know it without running the
    pickle, so it is reported as unknowable (a refusal), never passed."""
    ops = (b"\x80\x04" + b"cbuiltins\nstr\n" + b"\x8c\x08builtins\x85R"  # str("builtins"), a call's result
           + b"\x8c\x04exec\x93" + b"\x8c\x011\x85R.")  # STACK_GLOBAL on it; exec("1")
    assert pickle.loads(ops) is None  # a real pickle: it imports builtins.exec and runs it
    names, error = named_objects(io.BytesIO(ops))
    assert error is None and names[0] == "builtins.str"
    assert re.fullmatch(r"<an object whose name is computed while unpickling \(STACK_GLOBAL at byte \d+\)>", names[1])


def test_extension_codes_and_torn_streams():
    assert named_objects(io.BytesIO(b"\x80\x02\x82\x07.")) == (["<copyreg extension code 7 (byte 2)>"], None)
    names, error = named_objects(io.BytesIO(b"\x80\x02cbuiltins\nexec\n(X\x03\x00"))  # torn after the GLOBAL
    assert names == ["builtins.exec"] and "not a whole pickle" in error
    assert named_objects(io.BytesIO(b"not a pickle"))[1].startswith("not a whole pickle past byte 0")
