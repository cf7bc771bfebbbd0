// Gloo reports failures as exceptions whose message starts with the location
// inside Gloo ("[/path/to/file.cc:123] "), which means nothing to our users;
// this turns one into the plain sentence we put in a Status.
#pragma once

#include <gloo/common/error.h>

#include <exception>
#include <string>

namespace multislice::dcn {

inline std::string StripGlooLocation(std::string message) {
  if (!message.empty() && message.front() == '[') {
    const size_t close = message.find("] ");
    if (close != std::string::npos) message.erase(0, close + 2);
  }
  return message;
}

inline std::string GlooErrorMessage(const std::exception& e) {
  if (auto* enforce = dynamic_cast<const gloo::EnforceNotMet*>(&e)) {
    return StripGlooLocation(enforce->msg());
  }
  return StripGlooLocation(e.what());
}

}  // namespace multislice::dcn
