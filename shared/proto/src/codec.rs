//! The protobuf codec of every generated client and server: tonic's prost codec, except for the
//! status of a message that does not decode.
//!
//! tonic answers a request whose bytes are not a valid message with INTERNAL, the gRPC library
//! convention. To a platform team, INTERNAL means "the service is broken" (it pages, it is
//! retried); a malformed request is the caller's mistake, and gets INVALID_ARGUMENT with the
//! message type it should have been. A response that does not decode (a client and server whose
//! contracts disagree) stays INTERNAL. Which of the two a message is, the name tells: buf's
//! `STANDARD` lint makes every RPC input a `...Request` and every output a `...Response`.

use std::marker::PhantomData;

use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::ProstEncoder;

/// Encodes `T` and decodes `U`, as `tonic_prost::ProstCodec` does.
#[derive(Debug, Clone)]
pub(crate) struct EngramCodec<T, U> {
    _messages: PhantomData<(T, U)>,
}

impl<T, U> Default for EngramCodec<T, U> {
    fn default() -> Self {
        Self {
            _messages: PhantomData,
        }
    }
}

impl<T, U> Codec for EngramCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = EngramDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        EngramDecoder {
            _message: PhantomData,
        }
    }
}

/// Decodes `U`; see the module documentation for the status of bytes that are not a `U`.
#[derive(Debug, Clone)]
pub(crate) struct EngramDecoder<U> {
    _message: PhantomData<U>,
}

impl<U: Message + Default> Decoder for EngramDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf)
            .map(Some)
            .map_err(|error| undecodable(message_name::<U>(), &error))
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

/// The proto name of a generated message type: `engram.v1.RememberRequest` for
/// `engram_proto::engram::v1::RememberRequest`.
fn message_name<U>() -> String {
    let rust_path = std::any::type_name::<U>();
    let in_package = rust_path
        .split_once("::engram::")
        .map_or(rust_path, |(_, rest)| rest);
    format!("engram.{}", in_package.replace("::", "."))
}

fn undecodable(name: String, error: &prost::DecodeError) -> Status {
    if name.ends_with("Request") {
        Status::invalid_argument(format!(
            "the request body is not a valid {name} message ({error})"
        ))
    } else {
        Status::internal(format!("could not decode a {name} message ({error})"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{RememberRequest, RememberResponse};

    #[test]
    fn messages_are_named_as_in_the_proto_package() {
        assert_eq!(
            message_name::<RememberRequest>(),
            "engram.v1.RememberRequest"
        );
    }

    #[test]
    fn a_request_that_does_not_decode_is_the_callers_mistake() {
        let error = RememberRequest::decode(&[0xff_u8, 0xff, 0xff][..]).unwrap_err();
        let status = undecodable(message_name::<RememberRequest>(), &error);
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(
            status
                .message()
                .starts_with("the request body is not a valid engram.v1.RememberRequest message"),
            "{}",
            status.message()
        );
    }

    #[test]
    fn a_response_that_does_not_decode_is_internal() {
        let error = RememberResponse::decode(&[0xff_u8, 0xff, 0xff][..]).unwrap_err();
        let status = undecodable(message_name::<RememberResponse>(), &error);
        assert_eq!(status.code(), tonic::Code::Internal);
    }
}
