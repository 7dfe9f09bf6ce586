"""E2B's secrets API through the real SDK's `Secret` class: create, read, update, list page by
page, destroy; values never come back; names and tenants kept apart; bad input refused with
E2B's error shape."""

import uuid

import pytest
from e2b import Secret
from e2b.exceptions import SecretException, SecretNotFoundException

from conftest import OTHER_KEY


def unique(prefix="s"):
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def secret():
    made = Secret.create(unique("OpenAI-Key"), "sk-live-123", metadata={"team": "a"})
    yield made
    Secret.destroy(made.secret_id)


def test_a_secret_s_life(secret):
    assert secret.secret_id.startswith("sec_")
    assert secret.name == secret.name.lower(), "names are stored lower-cased"
    assert (secret.version, secret.metadata) == (1, {"team": "a"})
    # By id and by name, either case of the name.
    for selector in (secret.secret_id, secret.name, secret.name.upper()):
        info = Secret.get_info(selector)
        assert (info.secret_id, info.version) == (secret.secret_id, 1)
    assert Secret.exists(secret.name)
    updated = Secret.update(secret.name, "sk-live-456")
    assert (updated.version, updated.metadata) == (2, {"team": "a"})
    assert updated.updated_at >= secret.updated_at and updated.created_at == secret.created_at
    updated = Secret.update(secret.secret_id, "sk-live-789", metadata={})
    assert (updated.version, updated.metadata) == (3, {})
    assert Secret.destroy(secret.name) is True
    assert Secret.exists(secret.secret_id) is False
    assert Secret.destroy(secret.secret_id) is False
    with pytest.raises(SecretNotFoundException):
        Secret.get_info(secret.secret_id)
    with pytest.raises(SecretNotFoundException):
        Secret.update(secret.secret_id, "again")
    # Its name is free again.
    again = Secret.create(secret.name, "v")
    Secret.destroy(again.secret_id)


def test_values_never_come_back(api, secret):
    for path in ("/secrets", f"/secrets/{secret.secret_id}"):
        r = api.get(path)
        assert r.status_code == 200, r.text
        assert "sk-live-123" not in r.text and "value" not in r.text, r.text
    r = api.post(f"/secrets/{secret.secret_id}", json={"value": "sk-live-999"})
    assert r.status_code == 200 and "sk-live-999" not in r.text, r.text


def test_listing_pages_oldest_first():
    names = [unique("page") for _ in range(5)]
    made = [Secret.create(n, "v") for n in names]
    try:
        paginator = Secret.list(limit=2)
        seen = []
        while paginator.has_next:
            page = paginator.next_items()
            assert len(page) <= 2
            seen += [s.name for s in page]
        assert [n for n in seen if n in names] == names
    finally:
        for s in made:
            Secret.destroy(s.secret_id)


def test_tenants_and_names_are_apart(secret):
    with pytest.raises(SecretNotFoundException):
        Secret.get_info(secret.secret_id, api_key=OTHER_KEY)
    assert Secret.destroy(secret.name, api_key=OTHER_KEY) is False
    # Another tenant may hold the same name.
    theirs = Secret.create(secret.name, "theirs", api_key=OTHER_KEY)
    assert theirs.secret_id != secret.secret_id
    Secret.destroy(theirs.secret_id, api_key=OTHER_KEY)
    assert Secret.get_info(secret.secret_id).version == 1
    with pytest.raises(SecretException, match="409"):
        Secret.create(secret.name.upper(), "again")


@pytest.mark.parametrize(
    "name, value, metadata",
    [
        ("", "v", None),
        ("sec_reserved", "v", None),
        ("with{brace", "v", None),
        ("with/slash", "v", None),
        ("x" * 129, "v", None),
        (unique(), "", None),
        (unique(), "line\r\nInjected: yes", None),
        (unique(), "v" * (16 * 1024 + 1), None),
        (unique(), "v", {f"k{i}": "" for i in range(33)}),
        (unique(), "v", {"k": "v" * 1025}),
    ],
)
def test_bad_input_is_a_clear_400(api, name, value, metadata):
    body = {"name": name, "value": value}
    if metadata is not None:
        body["metadata"] = metadata
    r = api.post("/secrets", json=body)
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["code"] == 400 and err["message"], err
    assert len(r.text) < 2000, "the refusal echoes a bounded name"


def test_malformed_bodies_are_refused(api, secret):
    for raw in (b"{", b"[]", b'{"name": 5, "value": "v"}'):
        r = api.post("/secrets", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
    assert api.post("/secrets", json={"name": unique()}).status_code == 400
    r = api.post(f"/secrets/{secret.secret_id}", json={"name": "renamed", "value": "v"})
    assert r.status_code == 400, r.text
    assert api.post(f"/secrets/{secret.secret_id}", json={}).status_code == 400
    assert api.get("/secrets", params={"limit": "0"}).status_code == 400
    assert api.get("/secrets", params={"nextToken": "garbage"}).status_code == 400
