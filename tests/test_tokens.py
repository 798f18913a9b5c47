"""Tokens and api keys (DESIGN §3), including the published test vector of docs/tokens.md."""

import hashlib
import hmac
import re

from authsvc.tokens import TOKEN_LENGTH, api_key_digest, mint_token, new_api_key, new_token_secret, token_matches

# The vector in docs/tokens.md; a throwaway secret, never used by any deployment.
VECTOR_SECRET = b"example-secret-do-not-use-0123456789"
VECTOR_TOKEN = "1b117a771a23d95f8778c560da624f554e4d3f38f775afe660b8d09c2aae718e"


def test_token_is_hmac_sha256_of_game_user_epoch_in_lowercase_hex():
    token = mint_token(VECTOR_SECRET, 1, 42, 0)
    assert token == hmac.new(VECTOR_SECRET, b"1:42:0", hashlib.sha256).hexdigest()
    assert re.fullmatch(r"[0-9a-f]{64}", token) and len(token) == TOKEN_LENGTH


def test_published_test_vector():
    assert mint_token(VECTOR_SECRET, 1, 42, 0) == VECTOR_TOKEN


def test_token_is_bound_to_game_user_and_epoch():
    base = mint_token(VECTOR_SECRET, 1, 42, 0)
    assert len({base, mint_token(VECTOR_SECRET, 2, 42, 0), mint_token(VECTOR_SECRET, 1, 43, 0),
                mint_token(VECTOR_SECRET, 1, 42, 1), mint_token(VECTOR_SECRET, 14, 2, 0)}) == 5


def test_token_matches_any_secret_of_a_rotation():
    old, new = b"old-secret-0123456789abcdef", b"new-secret-0123456789abcdef"
    old_token = mint_token(old, 3, 9, 0)
    assert token_matches((new, old), 3, 9, 0, old_token)
    assert token_matches((new, old), 3, 9, 0, mint_token(new, 3, 9, 0))
    assert not token_matches((new,), 3, 9, 0, old_token)
    assert not token_matches((new, old), 3, 9, 1, old_token)


def test_token_matches_rejects_wrong_lengths_and_non_ascii():
    secret = (VECTOR_SECRET,)
    assert not token_matches(secret, 1, 42, 0, VECTOR_TOKEN[:-1])
    assert not token_matches(secret, 1, 42, 0, VECTOR_TOKEN + "0")
    assert not token_matches(secret, 1, 42, 0, VECTOR_TOKEN[:-1] + "é")
    assert not token_matches(secret, 1, 42, 0, "")


def test_api_keys_are_random_uuid_shaped():
    keys = {new_api_key() for _ in range(200)}
    assert len(keys) == 200
    assert all(re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", k) for k in keys)


def test_api_key_digest_is_sha256_hex():
    assert api_key_digest("abc") == hashlib.sha256(b"abc").hexdigest()
    assert api_key_digest("ключ") == hashlib.sha256("ключ".encode()).hexdigest()


def test_new_token_secret_is_256_bits_of_hex():
    a, b = new_token_secret(), new_token_secret()
    assert a != b and re.fullmatch(r"[0-9a-f]{64}", a)
