// OpenSSL's libcrypto (libssl-dev): the EVP digest API for streaming digests, and the
// primitives of age encryption at rest (X25519, HKDF-SHA256, HMAC-SHA256,
// ChaCha20-Poly1305, the random generator). dld implements no primitive itself.
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
