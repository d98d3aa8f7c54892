//! Fuzz the send-stream reader: any input must give commands or an error, never a
//! panic. Every decoded command is written back and must decode to itself, and
//! the input is also dumped (to a sink).
#![no_main]

use std::io;

use libfuzzer_sys::fuzz_target;
use stream_format::dump::{DumpOptions, dump};
use stream_format::{ReaderOptions, StreamReader, StreamWriter, WriterOptions};

fuzz_target!(|data: &[u8]| {
    let opts = ReaderOptions::new()
        .with_max_version(3)
        .with_max_command_len(1 << 20);
    let mut reader = StreamReader::with_options(data, opts);
    for _ in 0..100_000 {
        match reader.next_command() {
            Ok(None) => break,
            Ok(Some((info, cmd))) => {
                let wopts =
                    WriterOptions::new(info.version.clamp(1, 3)).with_max_command_size(2 << 20);
                let mut w = StreamWriter::with_options(Vec::new(), wopts).expect("valid version");
                if w.write(&cmd).is_ok() {
                    let bytes = w.into_inner();
                    let mut again =
                        StreamReader::with_options(bytes.as_slice(), opts.with_max_version(3));
                    let (_, back) = again
                        .next_command()
                        .expect("re-encoded command decodes")
                        .expect("one command");
                    assert_eq!(back, cmd);
                }
            }
            Err(e) => {
                assert!(e.to_string().contains("offset"));
                if !e.is_recoverable() {
                    break;
                }
            }
        }
    }
    let _ = dump(
        data,
        io::sink(),
        &DumpOptions::with_time_zone(jiff::tz::TimeZone::UTC),
    );
});
