"""Where koder-sandbox answers differently from E2B on purpose, said clearly."""


def test_entry_owner_and_group(sandbox):
    sandbox.files.write("owned-info.txt", "x")
    info = sandbox.files.get_info("owned-info.txt")
    assert (info.owner, info.group) == ("user", "user")
