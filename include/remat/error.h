// remat/error.h — how remat reports misuse.
//
// Every user error is a `c10::Error` (the exception LibTorch itself throws), with a message that
// starts with "remat: ", says what was expected and, where it helps, how to fix it. Tests match
// substrings of these messages, so treat their wording as part of the interface.
#pragma once

#include <c10/util/Exception.h>

/// Throws `c10::Error` with "remat: " and the streamed message parts when `cond` is false.
#define REMAT_CHECK(cond, ...) TORCH_CHECK((cond), "remat: ", __VA_ARGS__)
