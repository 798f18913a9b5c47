"""Tokens and api keys (docs/tokens.md), including its published test vector."""

import hashlib
import hmac
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from authsvc.tokens import TokenVerifier, api_key_digest, mint_token, new_api_key, new_token_secret

# The vector in docs/tokens.md; a throwaway secret, never used by any deployment.
VECTOR_SECRET = b"example-secret-do-not-use-0123456789"
VECTOR_TOKEN = "1b117a771a23d95f8778c560da624f554e4d3f38f775afe660b8d09c2aae718e"


def test_token_is_hmac_sha256_of_game_user_epoch_in_lowercase_hex():
    token = mint_token(VECTOR_SECRET, 1, 42, 0)
    assert token == hmac.new(VECTOR_SECRET, b"1:42:0", hashlib.sha256).hexdigest()
    assert re.fullmatch(r"[0-9a-f]{64}", token)


def test_published_test_vector():
    assert mint_token(VECTOR_SECRET, 1, 42, 0) == VECTOR_TOKEN


def test_token_is_bound_to_game_user_and_epoch():
    base = mint_token(VECTOR_SECRET, 1, 42, 0)
    assert (
        len(
            {
                base,
                mint_token(VECTOR_SECRET, 2, 42, 0),
                mint_token(VECTOR_SECRET, 1, 43, 0),
                mint_token(VECTOR_SECRET, 1, 42, 1),
                mint_token(VECTOR_SECRET, 14, 2, 0),
            }
        )
        == 5
    )


@settings(max_examples=300, deadline=None)
@given(
    secret=st.binary(
        min_size=0, max_size=200
    ),  # shorter than, equal to and longer than SHA-256's 64-byte block
    game_id=st.integers(0, 2**63 - 1),
    user_id=st.integers(0, 2**63 - 1),
    epoch=st.integers(0, 2**31),
)
def test_verifier_accepts_exactly_the_hmac_sha256_token(secret, game_id, user_id, epoch):
    """TokenVerifier agrees with hmac.new."""
    verifier = TokenVerifier((secret,))
    token = hmac.new(secret, f"{game_id}:{user_id}:{epoch}".encode(), hashlib.sha256).hexdigest()
    assert verifier.matches(game_id, user_id, epoch, token)
    assert not verifier.matches(game_id, user_id, epoch + 1, token)
    assert not verifier.matches(
        game_id, user_id, epoch, token.upper() if token != token.upper() else "0" * 64
    )


def test_verifier_accepts_the_published_vector_and_never_shows_its_secret():
    assert TokenVerifier((VECTOR_SECRET,)).matches(1, 42, 0, VECTOR_TOKEN)
    assert "example" not in repr(TokenVerifier((VECTOR_SECRET,)))


def test_token_matches_any_secret_of_a_rotation():
    old, new = b"old-secret-0123456789abcdef", b"new-secret-0123456789abcdef"
    old_token = mint_token(old, 3, 9, 0)
    assert TokenVerifier((new, old)).matches(3, 9, 0, old_token)
    assert TokenVerifier((new, old)).matches(3, 9, 0, mint_token(new, 3, 9, 0))
    assert not TokenVerifier((new,)).matches(3, 9, 0, old_token)
    assert not TokenVerifier((new, old)).matches(3, 9, 1, old_token)


def test_token_matches_rejects_wrong_lengths_and_non_ascii():
    verifier = TokenVerifier((VECTOR_SECRET,))
    assert not verifier.matches(1, 42, 0, VECTOR_TOKEN[:-1])
    assert not verifier.matches(1, 42, 0, VECTOR_TOKEN + "0")
    assert not verifier.matches(1, 42, 0, VECTOR_TOKEN[:-1] + "é")
    assert not verifier.matches(1, 42, 0, "")


def test_api_keys_are_random_uuid_shaped():
    keys = {new_api_key() for _ in range(200)}
    assert len(keys) == 200
    assert all(
        re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", k)
        for k in keys
    )


def test_api_key_digest_is_sha256_hex():
    assert api_key_digest("abc") == hashlib.sha256(b"abc").hexdigest()
    assert api_key_digest("ключ") == hashlib.sha256("ключ".encode()).hexdigest()


def test_new_token_secret_is_256_bits_of_hex():
    a, b = new_token_secret(), new_token_secret()
    assert a != b and re.fullmatch(r"[0-9a-f]{64}", a)


def test_current_token_names_what_is_missing_with_the_core_error(world, admin_store):
    """tokens.py is core: a missing game or player is the typed NotFound of authsvc/errors.py,
    which the command prints as one line and the admin API answers with 404."""
    from authsvc.errors import NotFound
    from authsvc.tokens import current_token

    with pytest.raises(NotFound, match="^no game 999999$"):
        current_token(admin_store, b"s" * 32, 999999, world.user_id)
    with pytest.raises(NotFound, match="^no player 999999$"):
        current_token(admin_store, b"s" * 32, world.game_id, 999999)
