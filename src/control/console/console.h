// The console: a web page served by the controller at /console (issue 7).
// Its static files (HTML, CSS, JavaScript; no framework, nothing fetched
// from elsewhere) are built into the binary by CMake (embed.cmake turns each
// file into a byte array) and served as they are; the page itself calls only
// the controller's API, with the bearer token the user enters.
#pragma once

#include <httplib.h>

#include <string_view>

namespace multislice::control {

struct ConsoleFile {
  std::string_view path;  // "index.html", "console.js", ...
  std::string_view content_type;
  std::string_view bytes;
};

// Every embedded file (generated at build time).
const ConsoleFile* ConsoleFiles(size_t* count);

// Serves GET /console (redirected to /console/), /console/ (index.html) and
// /console/FILE, with a Content-Security-Policy that allows only the page's
// own origin. Unknown files are 404.
void MountConsole(httplib::Server& server);

}  // namespace multislice::control
