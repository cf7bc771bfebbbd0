// Test support: TFRecord files written by an independent writer, a short
// Python program with its own CRC32C (bit by bit, not table-driven) and its
// own protobuf encoding of tf.train.Example, written from the formats'
// definitions, so that the C++ reader is checked against something it does
// not share code with. Needs only Debian's python3.
#pragma once

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace multislice::testing_util {

// The writer: python3 WRITER SPEC.json OUT.tfrecord. SPEC is a list of
// records; each is {"raw": "<hex>"} (the data as given) or {"features":
// {name: {"bytes": [str...]} | {"bytes_hex": [hex...]} | {"int64": [int...]}
// | {"float": [x...]}}}.
inline constexpr char kTfRecordWriterPy[] = R"PY(
import json, struct, sys

def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF

def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF

def varint(n):
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)

def length_delimited(number, payload):
    return varint(number << 3 | 2) + varint(len(payload)) + payload

def feature(spec):
    if "bytes_hex" in spec:
        values = b"".join(length_delimited(1, bytes.fromhex(v))
                          for v in spec["bytes_hex"])
        return length_delimited(1, values)
    if "bytes" in spec:
        values = b"".join(length_delimited(1, v.encode("utf-8"))
                          for v in spec["bytes"])
        return length_delimited(1, values)            # bytes_list = 1
    if "float" in spec:
        packed = b"".join(struct.pack("<f", v) for v in spec["float"])
        return length_delimited(2, length_delimited(1, packed))
    packed = b"".join(varint(v) for v in spec["int64"])
    return length_delimited(3, length_delimited(1, packed))

def example(features):
    entries = b"".join(
        length_delimited(1, length_delimited(1, name.encode("utf-8")) +
                         length_delimited(2, feature(spec)))
        for name, spec in features.items())
    return length_delimited(1, entries)               # features = 1

def record(data):
    length = struct.pack("<Q", len(data))
    return (length + struct.pack("<I", masked(crc32c(length))) + data +
            struct.pack("<I", masked(crc32c(data))))

spec = json.load(open(sys.argv[1], encoding="utf-8"))
with open(sys.argv[2], "wb") as out:
    for r in spec:
        data = bytes.fromhex(r["raw"]) if "raw" in r else example(r["features"])
        out.write(record(data))
)PY";

// Writes `records` (the SPEC above) to `path` with the Python writer, its
// script and spec beside `path`. True on success.
inline bool WriteTfRecordWithPython(
    const std::string& path, const std::vector<nlohmann::json>& records) {
  const std::string script = path + ".writer.py";
  const std::string spec = path + ".spec.json";
  std::ofstream(script) << kTfRecordWriterPy;
  std::ofstream(spec) << nlohmann::json(records).dump();
  const std::string command =
      "/usr/bin/python3 " + script + " " + spec + " " + path;
  const bool ok = std::system(command.c_str()) == 0;
  std::remove(script.c_str());
  std::remove(spec.c_str());
  return ok;
}

// A record of one bytes feature `name` holding `text`.
inline nlohmann::json TextRecord(const std::string& text,
                                 const std::string& name = "text") {
  return {{"features", {{name, {{"bytes", {text}}}}}}};
}

}  // namespace multislice::testing_util
