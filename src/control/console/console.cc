#include "control/console/console.h"

#include <string>

namespace multislice::control {

void MountConsole(httplib::Server& server) {
  server.Get("/console", [](const httplib::Request&, httplib::Response& res) {
    res.set_redirect("/console/");
  });
  server.Get(R"(/console/([A-Za-z0-9._-]*))",
             [](const httplib::Request& req, httplib::Response& res) {
               std::string path = req.matches[1];
               if (path.empty()) path = "index.html";
               size_t count = 0;
               const ConsoleFile* files = ConsoleFiles(&count);
               for (size_t i = 0; i < count; ++i) {
                 if (files[i].path != path) continue;
                 res.set_header("Content-Security-Policy",
                                "default-src 'self'; img-src 'self' data:; "
                                "object-src 'none'; base-uri 'none'; "
                                "form-action 'self'; frame-ancestors 'none'");
                 res.set_header("X-Content-Type-Options", "nosniff");
                 res.set_header("Referrer-Policy", "no-referrer");
                 res.set_header("Cache-Control", "no-cache");
                 res.set_content(std::string(files[i].bytes),
                                 std::string(files[i].content_type));
                 return;
               }
               res.status = 404;
               res.set_content("no such console file\n", "text/plain");
             });
}

}  // namespace multislice::control
