package kafka_batch_peers;

import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;

/**
 * The Kafka sink's case as a Kafka Streams application: every page view of the input topic published to
 * the output topic, keyed by its user, its value the page and the duration, with exactly_once_v2. A batch
 * job: it runs until its committed input offsets reach the ends the input had when it started, then
 * closes. Prints the records it read. Run by make bench (scripts/bench/peers/launch.py compiles it):
 *
 * <pre>java -cp ... kafka_batch_peers.PageViewStreams bootstrap input output application-id threads</pre>
 */
public final class PageViewStreams {
    private static final ObjectMapper JSON = new ObjectMapper();

    private PageViewStreams() {
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String input = args[1];
        String output = args[2];
        String applicationId = args[3];
        Properties config = new Properties();
        config.put(StreamsConfig.APPLICATION_ID_CONFIG, applicationId);
        config.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        config.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        config.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, Integer.parseInt(args[4]));
        config.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
        config.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(input, Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
                .filter((key, value) -> value != null)
                .map((key, value) -> {
                    JsonNode view = read(value);
                    ObjectNode published = JSON.createObjectNode();
                    published.set("page", view.get("page"));
                    published.set("duration_ms", view.get("duration_ms"));
                    return KeyValue.pair(view.get("user_id").asText(), published.toString());
                })
                .to(output, Produced.with(Serdes.String(), Serdes.String()));

        try (Admin admin = Admin.create(Map.of(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap))) {
            Map<TopicPartition, Long> ends = ends(admin, input);
            long records = ends.values().stream().mapToLong(Long::longValue).sum();
            CountDownLatch failed = new CountDownLatch(1);
            KafkaStreams streams = new KafkaStreams(builder.build(), config);
            streams.setUncaughtExceptionHandler(exception -> {
                exception.printStackTrace();
                failed.countDown();
                return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse
                        .SHUTDOWN_CLIENT;
            });
            streams.start();
            while (!done(admin, applicationId, ends)) {
                if (failed.await(100, TimeUnit.MILLISECONDS)) {
                    streams.close(Duration.ofSeconds(30));
                    System.exit(1);
                }
            }
            streams.close(Duration.ofSeconds(60));
            System.out.println(records);
        }
    }

    private static JsonNode read(byte[] value) {
        try {
            return JSON.readTree(value);
        } catch (java.io.IOException e) {
            throw new IllegalArgumentException("a page view that is not JSON", e);
        }
    }

    /** The input's end offsets now (its records start at offset 0: the bench's topics are new). */
    private static Map<TopicPartition, Long> ends(Admin admin, String topic) throws Exception {
        List<TopicPartition> partitions = admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic)
                .partitions().stream().map(p -> new TopicPartition(topic, p.partition())).toList();
        Map<TopicPartition, OffsetSpec> latest = new HashMap<>();
        partitions.forEach(p -> latest.put(p, OffsetSpec.latest()));
        Map<TopicPartition, Long> ends = new HashMap<>();
        admin.listOffsets(latest).all().get().forEach((p, info) -> ends.put(p, info.offset()));
        return ends;
    }

    /** Whether the application's committed offsets have reached every end. */
    private static boolean done(Admin admin, String group, Map<TopicPartition, Long> ends) throws Exception {
        Map<TopicPartition, OffsetAndMetadata> committed = admin.listConsumerGroupOffsets(group)
                .partitionsToOffsetAndMetadata().get();
        return ends.entrySet().stream().allMatch(end -> end.getValue() == 0
                || (committed.get(end.getKey()) != null && committed.get(end.getKey()).offset() >= end.getValue()));
    }
}
