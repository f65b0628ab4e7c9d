package stepgraph

/*
#include "stepgraph/c_api/c_session.h"
*/
import "C"

import (
	"errors"
	"fmt"
)

// Error is a failed call: the C ABI's return code, the function that returned it, and a
// message saying what was wrong where there is one (a session's, or the size check of a
// kernel wrapper). Compare it with the sentinels below through errors.Is:
//
//	if errors.Is(err, stepgraph.ErrNotAvailable) { ... use a CPU path ... }
type Error struct {
	Code    int32  // a STEPGRAPH_ERROR_* value
	Func    string // the C function, e.g. "stepgraph_session_prefill"
	Message string
}

// The return codes as values for errors.Is: an *Error is each of them whose code it has.
var (
	// No device or driver, or a library built without CUDA (code -1): use a CPU path.
	ErrNotAvailable = &Error{Code: C.STEPGRAPH_ERROR_NO_CUDA}
	// A bad size, shape, dtype, pointer, parameter or session state (code -2).
	ErrInvalidArgument = &Error{Code: C.STEPGRAPH_ERROR_INVALID_VALUE}
	// CUDA refused or failed the launch, or a session's step failed (code -3).
	ErrLaunchFailed = &Error{Code: C.STEPGRAPH_ERROR_LAUNCH_FAILED}
	// Code -4.
	ErrOutOfMemory = &Error{Code: C.STEPGRAPH_ERROR_OUT_OF_MEMORY}
	// A text function on a model without a tokenizer, such as the built-in one (code -5).
	ErrNoTokenizer = &Error{Code: C.STEPGRAPH_ERROR_NO_TOKENIZER}
)

// ErrClosed is returned by every call on a Session after Close.
var ErrClosed = errors.New("stepgraph: the session is closed")

func (e *Error) Error() string {
	s := fmt.Sprintf("%s (%d)", ErrorString(e.Code), e.Code)
	if e.Func != "" {
		s = e.Func + ": " + s
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	return "stepgraph: " + s
}

// Is makes errors.Is(err, ErrInvalidArgument) true for every *Error of that code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Func == "" && t.Message == "" && t.Code == e.Code
}

// ErrorString is the library's description of a return code.
func ErrorString(code int32) string {
	// The session library's own code, which the kernel library does not know.
	if code == C.STEPGRAPH_ERROR_NO_TOKENIZER {
		return "the model has no tokenizer"
	}
	return goString(stepgraph_error_string(code))
}

// check is nil for STEPGRAPH_OK, else the *Error of the code.
func check(code int32, function string) error {
	if code == C.STEPGRAPH_OK {
		return nil
	}
	return &Error{Code: code, Func: function}
}

func invalid(function, format string, args ...any) error {
	return &Error{Code: C.STEPGRAPH_ERROR_INVALID_VALUE, Func: function,
		Message: fmt.Sprintf(format, args...)}
}

// ABIVersions are the C ABI versions of the loaded libraries (kernels, sessions); they
// equal KernelABIVersion and SessionABIVersion, the headers' that this package was built
// with, unless a library was swapped after the build.
func ABIVersions() (kernels, sessions int32) {
	return stepgraph_abi_version(), stepgraph_session_abi_version()
}

// The headers' versions.
const (
	KernelABIVersion  = C.STEPGRAPH_C_API_VERSION
	SessionABIVersion = C.STEPGRAPH_SESSION_API_VERSION
)
