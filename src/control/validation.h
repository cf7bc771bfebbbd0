// Checks of the untrusted text that reaches the controller outside a JSON
// body: resource ids and the other path segments of an API name, list
// paging parameters, and the helpers that keep such text safe to echo in a
// message (valid UTF-8, no control characters, bounded length).
//
// Every check returns kInvalidArgument with one sentence: the field, the
// value as QuoteForMessage() shows it, and what was expected. None of them
// throws, and each message is valid UTF-8 whatever the input bytes.
//
// cpp-httplib percent-decodes the path before routing and each query value
// before a handler reads it, so these functions receive decoded bytes:
// `p%FF` arrives as "p\xFF" and is refused here as a 400 naming the segment.
//
// Thread-safety: all functions are pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace multislice::control {

// The longest id (queued resource, node, operation) and path segment, in
// characters: RFC 1035 labels, as the Cloud TPU API defines its ids.
inline constexpr size_t kMaxIdLength = 63;
// List paging: pageSize 0 (or absent) means kDefaultPageSize.
inline constexpr int kDefaultPageSize = 100;
inline constexpr int kMaxPageSize = 1000;

// Whether `text` is well-formed UTF-8 (no overlong forms, surrogates or
// code points past U+10FFFF). On false, *bad_offset (when given) is the
// byte offset of the first byte of the first ill-formed sequence.
bool IsValidUtf8(std::string_view text, size_t* bad_offset = nullptr);

// `value` in single quotes, safe to put in a message: printable ASCII as is
// (a quote or backslash escaped with a backslash), whole well-formed UTF-8
// characters as is except C1 controls and bidirectional overrides
// (\u202E), every other byte as \xNN; cut after max_chars characters
// (never inside a character) with "..." before the closing quote.
std::string QuoteForMessage(std::string_view value, size_t max_chars = 64);

// A queued resource id, node id or node id prefix:
// ^[a-z]([-a-z0-9]*[a-z0-9])?$, at most kMaxIdLength characters. Such an id
// is never ".", "..", empty, or anything with '/', so it is safe as a file
// name.
bool IsResourceId(std::string_view value);
Status ValidateResourceId(std::string_view field, std::string_view value);

// An operation id ("operation-0123456789abcdef"): the resource id rule.
Status ValidateOperationId(std::string_view field, std::string_view value);

// A project: ^[a-z0-9]([-a-z0-9.:]*[a-z0-9])?$, at most kMaxIdLength
// characters (GCP project ids, project numbers and domain-scoped ids such
// as "example.com:proj"; short test projects such as "p").
Status ValidateProjectId(std::string_view field, std::string_view value);

// A zone (location): ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$, at most kMaxIdLength
// characters; "-" (every zone) too when allow_wildcard.
Status ValidateZone(std::string_view field, std::string_view value,
                    bool allow_wildcard);

// An ICI domain (the hosts joined by ICI, agent --ici-domain): "" (none)
// or the zone rule, ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$, at most 63 characters.
Status ValidateIciDomain(std::string_view field, std::string_view value);

// The segments of projects/{project}/locations/{zone}: fields "project" and
// "location" ("-" allowed for lists when allow_wildcard).
Status ValidateParent(std::string_view project, std::string_view zone,
                      bool allow_wildcard);
// projects/{project}/locations/{zone}/queuedResources/{id}: get, delete,
// reset. Fields "project", "location", "queued_resource".
Status ValidateQueuedResourceName(std::string_view project,
                                  std::string_view zone, std::string_view id);
// projects/{project}/locations/{zone}/operations/{id}. Fields "project",
// "location", "operation".
Status ValidateOperationName(std::string_view project, std::string_view zone,
                             std::string_view id);

// A boolean query parameter as Google's front end reads it: true or false
// in any case ("True" is what gcloud sends), or 1 and 0; "" (absent) is
// false. Anything else: "Invalid value at 'force' (TYPE_BOOL), 'yes'".
Result<bool> ParseBoolParam(std::string_view field, std::string_view text);

// pageSize: a decimal integer 0..kMaxPageSize; 0 means kDefaultPageSize.
Result<int> ParsePageSize(std::string_view text);

// pageToken: "" (the first page) or a token made by FormatPageToken; the
// creation sequence number after which the page starts (0 for the first
// page). Anything else is kInvalidArgument, never an exception.
Result<int64_t> ParsePageToken(std::string_view text);
std::string FormatPageToken(int64_t after_seq);

// Checks JSON text before it is parsed into a tree: well-formed UTF-8
// throughout and arrays/objects nested at most max_depth deep (counted
// without recursion, outside strings). The error names the line and column
// (1-based, columns in bytes): "malformed JSON at line L, column C: ...".
Status CheckJsonText(std::string_view text, int max_depth);

// "line L, column C" of byte `offset` in `text` (1-based; columns in bytes).
std::string TextPosition(std::string_view text, size_t offset);

}  // namespace multislice::control
