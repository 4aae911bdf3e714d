#!/usr/bin/python3
"""Decodes a TensorBoard event file with Google's protobuf (Debian's python3-protobuf), as an
independent check of accelerate/trackers/tensorboard_events.cpp's hand-written encoding.

The message types are tensorflow.Event, Summary and Summary.Value with the field numbers of
tensorflow/core/util/event.proto and framework/summary.proto, built here from descriptors
(no protoc, no TensorFlow). Prints the file_version, then one "step tag value" line per
scalar and one "step tag text:plugin:dtype:repr(string)" line per text (the text plugin's
SummaryMetadata and DT_STRING tensor of framework/summary.proto and tensor.proto); for the
hparams plugin (tensorboard/plugins/hparams/plugin_data.proto, google.protobuf.Value of
struct.proto) one "hparams start name=kind:repr(value) ..." or "hparams end status=S" line.
Usage: decode_tfevents.py FILE
"""
import struct
import sys

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

F = descriptor_pb2.FieldDescriptorProto


def event_class():
    file = descriptor_pb2.FileDescriptorProto(name="event_check.proto", package="tensorflow")
    plugin = file.message_type.add(name="PluginData")
    plugin.field.add(name="plugin_name", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    plugin.field.add(name="content", number=2, type=F.TYPE_BYTES, label=F.LABEL_OPTIONAL)
    metadata = file.message_type.add(name="SummaryMetadata")
    metadata.field.add(name="plugin_data", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                       type_name=".tensorflow.PluginData")
    file.message_type.add(name="TensorShapeProto")
    tensor = file.message_type.add(name="TensorProto")
    tensor.field.add(name="dtype", number=1, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    tensor.field.add(name="tensor_shape", number=2, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                     type_name=".tensorflow.TensorShapeProto")
    tensor.field.add(name="string_val", number=8, type=F.TYPE_BYTES, label=F.LABEL_REPEATED)
    summary = file.message_type.add(name="Summary")
    value = summary.nested_type.add(name="Value")
    value.field.add(name="tag", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    value.field.add(name="simple_value", number=2, type=F.TYPE_FLOAT, label=F.LABEL_OPTIONAL)
    value.field.add(name="tensor", number=8, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                    type_name=".tensorflow.TensorProto")
    value.field.add(name="metadata", number=9, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                    type_name=".tensorflow.SummaryMetadata")
    summary.field.add(name="value", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                      type_name=".tensorflow.Summary.Value")
    event = file.message_type.add(name="Event")
    event.field.add(name="wall_time", number=1, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
    event.field.add(name="step", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    event.field.add(name="file_version", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    event.field.add(name="summary", number=5, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                    type_name=".tensorflow.Summary")
    value = file.message_type.add(name="Value")
    value.field.add(name="number_value", number=2, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
    value.field.add(name="string_value", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    value.field.add(name="bool_value", number=4, type=F.TYPE_BOOL, label=F.LABEL_OPTIONAL)
    start = file.message_type.add(name="SessionStartInfo")
    entry = start.nested_type.add(name="HparamsEntry")  # the wire form of a map entry
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                    type_name=".tensorflow.Value")
    start.field.add(name="hparams", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                    type_name=".tensorflow.SessionStartInfo.HparamsEntry")
    start.field.add(name="start_time_secs", number=5, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
    end = file.message_type.add(name="SessionEndInfo")
    end.field.add(name="status", number=1, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    end.field.add(name="end_time_secs", number=2, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
    hparams = file.message_type.add(name="HParamsPluginData")
    hparams.field.add(name="version", number=1, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    hparams.field.add(name="session_start_info", number=3, type=F.TYPE_MESSAGE,
                      label=F.LABEL_OPTIONAL, type_name=".tensorflow.SessionStartInfo")
    hparams.field.add(name="session_end_info", number=4, type=F.TYPE_MESSAGE,
                      label=F.LABEL_OPTIONAL, type_name=".tensorflow.SessionEndInfo")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_class(pool, "tensorflow.Event"), message_class(pool, "tensorflow.HParamsPluginData")


def message_class(pool, name):
    descriptor = pool.FindMessageTypeByName(name)
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(descriptor)
    return message_factory.MessageFactory(pool).GetPrototype(descriptor)


def hparams_line(HParams, content):
    data = HParams.FromString(content)
    if data.HasField("session_end_info"):
        return "hparams end status=%d" % data.session_end_info.status
    items = []
    for entry in data.session_start_info.hparams:
        kinds = [k for k in ("number_value", "string_value", "bool_value")
                 if entry.value.HasField(k)]
        kind = kinds[0] if kinds else "none"
        items.append("%s=%s:%r" % (entry.key, kind.split("_")[0], getattr(entry.value, kind, None)))
    return "hparams start " + " ".join(items)


def main(path):
    Event, HParams = event_class()
    data = open(path, "rb").read()
    at = 0
    while at + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, at)
        if at + 12 + length + 4 > len(data):
            break
        event = Event.FromString(data[at + 12:at + 12 + length])
        if event.file_version:
            print("file_version", event.file_version)
        for v in event.summary.value:
            if v.metadata.plugin_data.plugin_name == "hparams":
                print(event.step, v.tag, hparams_line(HParams, v.metadata.plugin_data.content))
            elif v.HasField("tensor"):
                text = v.tensor.string_val[0].decode() if v.tensor.string_val else ""
                print(event.step, v.tag, "text:%s:%d:%r" % (
                    v.metadata.plugin_data.plugin_name, v.tensor.dtype, text))
            else:
                print(event.step, v.tag, repr(v.simple_value))
        at += 12 + length + 4


if __name__ == "__main__":
    main(sys.argv[1])
