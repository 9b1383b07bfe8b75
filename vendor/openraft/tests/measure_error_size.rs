// Measure the size of error types to guide optimization
use std::mem::size_of;

use openraft::BasicNode;
use openraft::ErrorSubject;
use openraft::ErrorVerb;
use openraft::StorageError;

// Define a simple test config
openraft::declare_raft_types!(
    pub TestConfig:
        NodeId = u64,
        Node = BasicNode,
        Entry = openraft::Entry<<Self::LeaderId as openraft::vote::RaftLeaderId>::Committed, Self::Payload>,
        AsyncRuntime = openraft_rt_tokio::TokioRuntime
);

#[test]
fn measure_storage_error_size() {
    println!("\n=== StorageError Size Analysis ===\n");

    let storage_error_size = size_of::<StorageError<TestConfig>>();
    println!("StorageError<TestConfig>:         {storage_error_size} bytes");

    println!("\n--- Components ---");
    println!(
        "ErrorSubject<TestConfig>:         {} bytes",
        size_of::<ErrorSubject<TestConfig>>()
    );
    println!("ErrorVerb:                        {} bytes", size_of::<ErrorVerb>());
    println!(
        "Box<anyerror::AnyError>:          {} bytes",
        size_of::<Box<anyerror::AnyError>>()
    );
    println!(
        "Option<String>:                   {} bytes",
        size_of::<Option<String>>()
    );

    println!("\n--- ErrorSubject Variants ---");
    use openraft::LogId;
    use openraft::SnapshotId;
    use openraft::storage::SnapshotSignature;
    use openraft::vote::RaftLeaderId;

    type Clid = <<TestConfig as openraft::RaftTypeConfig>::LeaderId as RaftLeaderId>::Committed;
    type LogIdOf<C> = LogId<<<C as openraft::RaftTypeConfig>::LeaderId as RaftLeaderId>::Committed>;

    println!(
        "LogIdOf<TestConfig>:              {} bytes",
        size_of::<LogIdOf<TestConfig>>()
    );
    println!(
        "Option<LogIdOf<TestConfig>>:      {} bytes",
        size_of::<Option<LogIdOf<TestConfig>>>()
    );
    println!(
        "SnapshotSignature<Clid>:          {} bytes",
        size_of::<SnapshotSignature<Clid>>()
    );
    println!(
        "Option<SnapshotSignature<Clid>>:  {} bytes",
        size_of::<Option<SnapshotSignature<Clid>>>()
    );

    println!("\n--- SnapshotSignature Components ---");
    println!(
        "Option<Box<LogIdOf<TestConfig>>>: {} bytes",
        size_of::<Option<Box<LogIdOf<TestConfig>>>>()
    );
    println!("SnapshotId (String):              {} bytes", size_of::<SnapshotId>());

    println!("\n--- Related Types ---");
    use openraft::errors::Fatal;
    use openraft::errors::RaftError;

    println!(
        "RaftError<TestConfig, ()>:        {} bytes",
        size_of::<RaftError<TestConfig, ()>>()
    );
    println!(
        "Fatal<TestConfig>:                {} bytes",
        size_of::<Fatal<TestConfig>>()
    );

    println!("\n=== Target ===");
    println!("Current:                          {storage_error_size} bytes");
    println!("Target:                           < 32 bytes");
    println!(
        "Reduction needed:                 {} bytes\n",
        storage_error_size.saturating_sub(32)
    );

    // Fail the test if size is too large (for tracking)
    if storage_error_size > 136 {
        panic!("StorageError size increased from 136 to {storage_error_size} bytes! This is a regression.");
    }
}
