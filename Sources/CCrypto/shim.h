// OpenSSL's libcrypto (libssl-dev): only the EVP digest API is used, for streaming digests.
#include <openssl/evp.h>
