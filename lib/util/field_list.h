#pragma once
// A file format's fields declared once, for writing and for reading: a function template
//   template <class S, class Field> void thing_fields(S& s, Field&& field) {
//     field("a", s.a);
//     field("b", s.b, kOptionalField);  // read only where the file has it (older files)
//   }
// called with a writer (S const) or a reader of the format: JsonWriter / JsonReader
// (util/json.h) for plans, the profile's attribute writer and reader for HDF5 profiles.

namespace dawnpiper {

constexpr bool kOptionalField = true;

}  // namespace dawnpiper
