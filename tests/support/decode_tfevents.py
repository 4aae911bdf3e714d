#!/usr/bin/python3
"""Decodes a TensorBoard event file with Google's protobuf (Debian's python3-protobuf), as an
independent check of accelerate/trackers/tensorboard_events.cpp's hand-written encoding.

The message types are tensorflow.Event, Summary and Summary.Value with the field numbers of
tensorflow/core/util/event.proto and framework/summary.proto, built here from descriptors
(no protoc, no TensorFlow). Prints the file_version, then one "step tag value" line per
scalar. Usage: decode_tfevents.py FILE
"""
import struct
import sys

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

F = descriptor_pb2.FieldDescriptorProto


def event_class():
    file = descriptor_pb2.FileDescriptorProto(name="event_check.proto", package="tensorflow")
    summary = file.message_type.add(name="Summary")
    value = summary.nested_type.add(name="Value")
    value.field.add(name="tag", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    value.field.add(name="simple_value", number=2, type=F.TYPE_FLOAT, label=F.LABEL_OPTIONAL)
    summary.field.add(name="value", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                      type_name=".tensorflow.Summary.Value")
    event = file.message_type.add(name="Event")
    event.field.add(name="wall_time", number=1, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
    event.field.add(name="step", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    event.field.add(name="file_version", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    event.field.add(name="summary", number=5, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                    type_name=".tensorflow.Summary")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    descriptor = pool.FindMessageTypeByName("tensorflow.Event")
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(descriptor)
    return message_factory.MessageFactory(pool).GetPrototype(descriptor)


def main(path):
    Event = event_class()
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
            print(event.step, v.tag, repr(v.simple_value))
        at += 12 + length + 4


if __name__ == "__main__":
    main(sys.argv[1])
