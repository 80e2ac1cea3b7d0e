// The bare generated stub: a @grpc/grpc-js client for a service described by
// protoc-gen-es (the descriptors in src/gen/, generated at build time from
// proto/). Each method takes a message and calls back with one; no deadline
// default, no error mapping: that is the idiomatic layer's (client.ts).
import * as grpc from "@grpc/grpc-js";
import { fromBinary, toBinary, type DescMessage, type MessageShape } from "@bufbuild/protobuf";
import type { GenService, GenServiceMethods } from "@bufbuild/protobuf/codegenv2";

type Callback<O> = (err: grpc.ServiceError | null, value?: O) => void;

/** The methods of a generated service as grpc-js unary calls. */
export type StubMethods<S extends GenServiceMethods> = {
  [K in keyof S]: (
    request: MessageShape<S[K]["input"]>,
    metadata: grpc.Metadata,
    options: grpc.CallOptions,
    callback: Callback<MessageShape<S[K]["output"]>>,
  ) => grpc.ClientUnaryCall;
};

/** The method map of a generated service. */
export type MethodsOf<T> = T extends GenService<infer S> ? S : never;

/** A grpc-js client class for a generated service. */
export type StubClass<S extends GenServiceMethods> = new (
  address: string,
  credentials: grpc.ChannelCredentials,
  options?: grpc.ClientOptions,
) => grpc.Client & StubMethods<S>;

/** The grpc-js service definition of a generated service (unary methods). */
export function serviceDefinition<S extends GenServiceMethods>(service: GenService<S>): grpc.ServiceDefinition {
  const definition: Record<string, grpc.MethodDefinition<any, any>> = {};
  for (const method of service.methods) {
    const input = method.input as DescMessage;
    const output = method.output as DescMessage;
    definition[method.localName] = {
      path: `/${service.typeName}/${method.name}`,
      requestStream: false,
      responseStream: false,
      requestSerialize: (m: MessageShape<DescMessage>) => Buffer.from(toBinary(input, m)),
      requestDeserialize: (b: Buffer) => fromBinary(input, b),
      responseSerialize: (m: MessageShape<DescMessage>) => Buffer.from(toBinary(output, m)),
      responseDeserialize: (b: Buffer) => fromBinary(output, b),
      originalName: method.name,
    };
  }
  return definition;
}

/** The grpc-js client class of a generated service. */
export function stubClass<S extends GenServiceMethods>(service: GenService<S>): StubClass<S> {
  return grpc.makeClientConstructor(serviceDefinition(service), service.typeName) as unknown as StubClass<S>;
}
