"""Where koder-sandbox answers differently from E2B on purpose, said clearly."""

import pytest
from e2b import SandboxException


def test_entry_owner_and_group(sandbox):
    sandbox.files.write("owned-info.txt", "x")
    info = sandbox.files.get_info("owned-info.txt")
    assert (info.owner, info.group) == ("user", "user")


def test_file_metadata_is_refused_clearly(sandbox):
    with pytest.raises(SandboxException) as e:
        sandbox.files.write("meta.txt", "x", metadata={"owner": "me"})
    assert "metadata" in str(e.value) and "not supported" in str(e.value)
    assert sandbox.files.exists("meta.txt") is False
